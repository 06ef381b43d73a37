"""C++ of graphwire's ns-3 applications: the task controller and the host app.

Kept in a .py file so that it ships with the package; cppyy compiles it at run
time with :mod:`graphwire.simulate._ns3_fabric` (``APPS + FABRIC``). A `Plan`
carries the tasks in and the results out; see :mod:`graphwire.simulate.packet`
for the model.
"""

APPS = r"""
#include "ns3/core-module.h"
#include "ns3/csma-module.h"
#include "ns3/internet-module.h"
#include "ns3/network-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/traffic-control-module.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace graphwire_ns3
{
using namespace ns3;

const uint16_t DATA_PORT = 4791; // RoCEv2's UDP port
const uint16_t CNP_PORT = 4792;
const uint32_t KIND_DATA = 0;
const uint32_t KIND_CNP = 1;

// graphwire's 16-byte message header: task, sequence, kind, spare.
class GwHeader : public Header
{
  public:
    uint32_t task = 0, seq = 0, kind = 0, spare = 0;

    static TypeId GetTypeId()
    {
        static TypeId tid = TypeId("graphwire_ns3::GwHeader")
                                .SetParent<Header>()
                                .AddConstructor<GwHeader>();
        return tid;
    }

    TypeId GetInstanceTypeId() const override { return GetTypeId(); }

    uint32_t GetSerializedSize() const override { return 16; }

    void Serialize(Buffer::Iterator i) const override
    {
        i.WriteHtonU32(task);
        i.WriteHtonU32(seq);
        i.WriteHtonU32(kind);
        i.WriteHtonU32(spare);
    }

    uint32_t Deserialize(Buffer::Iterator i) override
    {
        task = i.ReadNtohU32();
        seq = i.ReadNtohU32();
        kind = i.ReadNtohU32();
        spare = i.ReadNtohU32();
        return 16;
    }

    void Print(std::ostream& os) const override
    {
        os << "task=" << task << " seq=" << seq << " kind=" << kind;
    }
};

// Marks data packets so that the link counters can tell them from CNPs and ARP.
class DataTag : public Tag
{
  public:
    static TypeId GetTypeId()
    {
        static TypeId tid =
            TypeId("graphwire_ns3::DataTag").SetParent<Tag>().AddConstructor<DataTag>();
        return tid;
    }

    TypeId GetInstanceTypeId() const override { return GetTypeId(); }

    uint32_t GetSerializedSize() const override { return 1; }

    void Serialize(TagBuffer i) const override { i.WriteU8(1); }

    void Deserialize(TagBuffer i) override { i.ReadU8(); }

    void Print(std::ostream& os) const override { os << "data"; }
};

// Everything Python hands over, and everything it reads back.
struct Plan
{
    // fabric
    int32_t num_nodes = 0;
    bool shared = false;
    double rate_bps = 0, delay_s = 0;
    std::vector<int32_t> link_a, link_b;     // undirected links (p2p) or medium members
    std::vector<uint32_t> link_addr;         // [2 * links]: address of a, of b
    uint32_t link_mask = 0;                  // prefix mask of link subnets
    std::vector<int32_t> local_node;         // extra /32 addresses on a node
    std::vector<uint32_t> local_addr;
    std::vector<int32_t> route_node, route_link; // at route_node, route_addr leaves by
    std::vector<uint32_t> route_addr;            // the device on route_link
    std::vector<uint32_t> pair_addr;             // [num_nodes^2] where src sends to dst
    std::vector<int32_t> is_switch;             // [num_nodes]
    // tasks
    std::vector<int32_t> task_node, task_dst, dep_ptr, dep_idx;
    std::vector<double> task_seconds;
    std::vector<int64_t> task_nbytes;
    // packets and rate control
    uint32_t payload_bytes = 8192, header_bytes = 46;
    uint64_t ecn_threshold_bytes = 100000;
    uint64_t queue_limit_bytes = 1u << 30;
    double cnp_interval_s = 50e-6, increase_period_s = 55e-6;
    double increase_step_bps = 0, min_rate_bps = 0;
    double alpha_g = 0;
    bool rate_control = true; // false: marks are counted, no CNP is sent
    double sample_s = 1e-6;
    bool sample_adaptive = true;
    uint32_t max_samples = 10000;
    // results
    std::vector<double> start, finish;
    std::vector<int64_t> dev_bytes;  // [2 * links] bytes sent by the a-side, b-side
    std::vector<uint64_t> queue_peak; // per monitored queue
    std::vector<double> trace_t;
    std::vector<double> trace_b; // [samples x queues] row-major
    uint64_t ecn_marks = 0; // data packets that arrived CE-marked
    uint64_t drops = 0, cnps = 0;
    int32_t ip_drop_reason = -1; // Ipv4L3Protocol::DropReason of the last IP drop
    uint64_t queue_drops = 0, ip_drops = 0;
    int64_t done = 0;
};

class GwApp;

// The global controller: starts tasks as their deps finish, records times.
class Controller
{
  public:
    Plan* plan = nullptr;
    std::vector<int32_t> pending;
    std::vector<int32_t> succ_ptr, succ_idx;
    std::vector<int64_t> rx_bytes;
    std::vector<double> last_cnp;
    std::vector<Ptr<GwApp>> apps;
    std::vector<Ptr<QueueDisc>> qdiscs;
    std::vector<Ptr<Queue<Packet>>> devqueues;
    std::vector<Ptr<QueueDisc>> all_qdiscs;
    std::vector<Ptr<Queue<Packet>>> all_devqueues;

    void Begin(uint32_t t);
    void Finish(uint32_t t);
    void Sample();
};

extern Controller g_ctl;

class GwApp : public Application
{
  public:
    struct Flow
    {
        uint32_t addr = 0;
        int64_t left = 0;
        uint32_t seq = 0;
        double rate = 0, target = 0; // bit/s: now, and DCQCN's target
        double last_adjust = 0;      // time of the last CNP or increase
        double last_send = 0, last_bits = 0;
        double alpha = 1;  // DCQCN's estimate of congestion: cut by alpha / 2
    };

    int32_t node = -1;
    Ptr<Socket> data_sock, cnp_sock;
    std::unordered_map<uint32_t, Flow> flows;

    static TypeId GetTypeId()
    {
        static TypeId tid = TypeId("graphwire_ns3::GwApp")
                                .SetParent<Application>()
                                .AddConstructor<GwApp>();
        return tid;
    }

    void Setup()
    {
        auto factory = UdpSocketFactory::GetTypeId();
        data_sock = Socket::CreateSocket(GetNode(), factory);
        data_sock->SetIpTos(0x02); // ECT(0): switches may mark CE
        data_sock->SetIpRecvTos(true);
        data_sock->Bind(InetSocketAddress(Ipv4Address::GetAny(), DATA_PORT));
        data_sock->SetRecvCallback(MakeCallback(&GwApp::Recv, this));
        cnp_sock = Socket::CreateSocket(GetNode(), factory);
        cnp_sock->SetIpTos(0x02); // ECT too: RED drops what it cannot mark
        cnp_sock->Bind(InetSocketAddress(Ipv4Address::GetAny(), CNP_PORT));
        cnp_sock->SetRecvCallback(MakeCallback(&GwApp::Recv, this));
    }

    void StartFlow(uint32_t t)
    {
        Plan& p = *g_ctl.plan;
        Flow f;
        f.addr = p.pair_addr[size_t(node) * p.num_nodes + p.task_dst[t]];
        f.left = p.task_nbytes[t];
        f.rate = f.target = p.rate_bps;
        f.last_adjust = f.last_send = Simulator::Now().GetSeconds();
        flows[t] = f;
        Wake(t);
    }

    // Sends the flow's next packet when its pacing allows, else sleeps until
    // then or until the next rate increase, whichever comes first.
    void Wake(uint32_t t)
    {
        Plan& p = *g_ctl.plan;
        Flow& f = flows[t];
        double now = Simulator::Now().GetSeconds();
        double period = p.increase_period_s;
        while (now + 1e-12 - f.last_adjust >= period && f.rate < p.rate_bps)
        {
            f.last_adjust += p.increase_period_s;
            f.alpha *= 1 - p.alpha_g;
            f.target = std::min(p.rate_bps, f.target + p.increase_step_bps);
            f.rate = (f.rate + f.target) / 2;
            if (p.rate_bps - f.rate < 1e-6 * p.rate_bps)
            {
                f.rate = p.rate_bps;
            }
        }
        // the ideal clock stays in double: no drift from ns rounding
        double due = f.last_send + f.last_bits / f.rate;
        if (due > now + 1e-9)
        {
            double wake = due;
            if (f.rate < p.rate_bps)
            {
                wake = std::min(wake, f.last_adjust + p.increase_period_s);
            }
            // round up to ns: a wake-up that rounds to now would spin
            Time sleep = NanoSeconds(std::ceil((wake - now) * 1e9));
            Simulator::Schedule(sleep, &GwApp::Wake, this, t);
            return;
        }
        f.last_send = std::max(due, now - 1e-9);
        uint32_t pay = uint32_t(std::min<int64_t>(f.left, p.payload_bytes));
        f.last_bits = double(pay + p.header_bytes) * 8.0;
        Ptr<Packet> pkt = Create<Packet>(pay);
        GwHeader h;
        h.task = t;
        h.seq = f.seq++;
        h.kind = KIND_DATA;
        pkt->AddHeader(h);
        pkt->AddPacketTag(DataTag());
        data_sock->SendTo(pkt, 0, InetSocketAddress(Ipv4Address(f.addr), DATA_PORT));
        f.left -= pay;
        if (f.left <= 0)
        {
            flows.erase(t);
            return;
        }
        Simulator::Schedule(Seconds(f.last_bits / f.rate), &GwApp::Wake, this, t);
    }

    void OnCnp(uint32_t t)
    {
        auto it = flows.find(t);
        if (it == flows.end())
        {
            return; // the flow has sent its last packet
        }
        Plan& p = *g_ctl.plan;
        Flow& f = it->second;
        f.target = f.rate;
        f.alpha = (1 - p.alpha_g) * f.alpha + p.alpha_g;
        f.rate = std::max(p.min_rate_bps, f.rate * (1 - f.alpha / 2));
        f.last_adjust = Simulator::Now().GetSeconds();
    }

    void Recv(Ptr<Socket> sock)
    {
        Plan& p = *g_ctl.plan;
        Ptr<Packet> pkt;
        Address from;
        while ((pkt = sock->RecvFrom(from)))
        {
            if (p.shared && p.delay_s > 0)
            {
                // the medium has no propagation delay (see Run): add it here
                Simulator::Schedule(Seconds(p.delay_s), &GwApp::Handle, this, pkt);
            }
            else
            {
                Handle(pkt);
            }
        }
    }

    void Handle(Ptr<Packet> pkt)
    {
        Plan& p = *g_ctl.plan;
        SocketIpTosTag tos;
        bool ce = pkt->PeekPacketTag(tos) && (tos.GetTos() & 0x3) == 0x3;
        GwHeader h;
        pkt->RemoveHeader(h);
        uint32_t t = h.task;
        if (h.kind == KIND_CNP)
        {
            OnCnp(t);
            return;
        }
        double now = Simulator::Now().GetSeconds();
        p.ecn_marks += ce;
        if (ce && p.rate_control && now - g_ctl.last_cnp[t] >= p.cnp_interval_s)
        {
            g_ctl.last_cnp[t] = now;
            SendCnp(t);
        }
        g_ctl.rx_bytes[t] += pkt->GetSize();
        if (g_ctl.rx_bytes[t] == p.task_nbytes[t])
        {
            g_ctl.Finish(t);
        }
    }

    void SendCnp(uint32_t t)
    {
        Plan& p = *g_ctl.plan;
        Ptr<Packet> pkt = Create<Packet>(0);
        GwHeader h;
        h.task = t;
        h.kind = KIND_CNP;
        pkt->AddHeader(h);
        uint32_t addr = p.pair_addr[size_t(node) * p.num_nodes + p.task_node[t]];
        cnp_sock->SendTo(pkt, 0, InetSocketAddress(Ipv4Address(addr), CNP_PORT));
        p.cnps++;
    }
};

Controller g_ctl;

void Controller::Begin(uint32_t t)
{
    Plan& p = *plan;
    p.start[t] = Simulator::Now().GetSeconds();
    if (p.task_dst[t] < 0)
    {
        Simulator::Schedule(Seconds(p.task_seconds[t]), &Controller::Finish, this, t);
    }
    else if (p.task_nbytes[t] == 0)
    {
        Simulator::ScheduleNow(&Controller::Finish, this, t);
    }
    else
    {
        Ptr<GwApp> app = apps[p.task_node[t]];
        Simulator::ScheduleWithContext(app->GetNode()->GetId(),
                                       Seconds(0),
                                       &GwApp::StartFlow,
                                       app,
                                       t);
    }
}

void Controller::Finish(uint32_t t)
{
    Plan& p = *plan;
    p.finish[t] = Simulator::Now().GetSeconds();
    p.done++;
    for (int32_t k = succ_ptr[t]; k < succ_ptr[t + 1]; k++)
    {
        uint32_t d = succ_idx[k];
        if (--pending[d] == 0)
        {
            Begin(d);
        }
    }
}

void Controller::Sample()
{
    Plan& p = *plan;
    size_t nq = qdiscs.size();
    if (p.sample_adaptive && p.trace_t.size() >= p.max_samples)
    {
        // keep every other sample and double the interval: at most max_samples
        size_t n = p.trace_t.size(), m = 0;
        for (size_t i = 0; i < n; i += 2, m++)
        {
            p.trace_t[m] = p.trace_t[i];
            std::copy_n(p.trace_b.begin() + i * nq, nq, p.trace_b.begin() + m * nq);
        }
        p.trace_t.resize(m);
        p.trace_b.resize(m * nq);
        p.sample_s *= 2;
    }
    p.trace_t.push_back(Simulator::Now().GetSeconds());
    for (size_t q = 0; q < nq; q++)
    {
        p.trace_b.push_back(qdiscs[q]->GetNBytes() + devqueues[q]->GetNBytes());
    }
    if (!Simulator::IsFinished())
    {
        Simulator::Schedule(Seconds(p.sample_s), &Controller::Sample, this);
    }
}

} // namespace graphwire_ns3
"""
