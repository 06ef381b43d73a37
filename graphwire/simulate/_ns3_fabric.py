"""C++ that builds the ns-3 fabric of a `Plan`, runs it and reads the results back.

``Run(plan)``: nodes, links, addresses, pinned routes, queue discs and counters,
then the event loop, then ``Simulator::Destroy`` so that runs can follow in one
process. Compiled after :data:`graphwire.simulate._ns3_apps.APPS`.
"""

FABRIC = r"""
namespace graphwire_ns3
{
using namespace ns3;

static void CountTx(uint32_t dev, Ptr<const Packet> pkt)
{
    DataTag tag;
    if (pkt->PeekPacketTag(tag))
    {
        g_ctl.plan->dev_bytes[dev] += pkt->GetSize();
    }
}

static void WatchQueue(uint32_t q, uint32_t, uint32_t)
{
    uint64_t now = g_ctl.qdiscs[q]->GetNBytes() + g_ctl.devqueues[q]->GetNBytes();
    uint64_t& peak = g_ctl.plan->queue_peak[q];
    peak = std::max(peak, now);
}

static void CountDrop(Ptr<const Packet>)
{
    g_ctl.plan->drops++;
}

static void CountIpDrop(const Ipv4Header&,
                        Ptr<const Packet>,
                        Ipv4L3Protocol::DropReason reason,
                        Ptr<Ipv4>,
                        uint32_t)
{
    g_ctl.plan->drops++;
    g_ctl.plan->ip_drops++;
    g_ctl.plan->ip_drop_reason = int32_t(reason);
}

// Builds the fabric, runs the workload, fills the plan's results.
void Run(Plan& p)
{
    Controller& c = g_ctl;
    c = Controller();
    c.plan = &p;
    size_t nt = p.task_node.size(), nl = p.link_a.size();
    p.start.assign(nt, -1.0);
    p.finish.assign(nt, -1.0);
    p.dev_bytes.assign(2 * nl, 0);
    p.trace_t.clear();
    p.trace_b.clear();
    p.ecn_marks = p.drops = p.cnps = p.queue_drops = p.ip_drops = 0;
    p.ip_drop_reason = -1;
    p.done = 0;

    NodeContainer nodes;
    nodes.Create(p.num_nodes);
    InternetStackHelper stack;
    stack.Install(nodes);

    // devices: dev[2*i] on link_a[i], dev[2*i+1] on link_b[i]; if_index likewise
    std::vector<Ptr<NetDevice>> dev(2 * nl);
    std::vector<uint32_t> ifindex(2 * nl);
    DataRate rate(uint64_t(p.rate_bps));
    Time delay = Seconds(p.delay_s);
    QueueSize one_packet("1p");
    if (p.shared)
    {
        CsmaHelper csma;
        csma.SetChannelAttribute("DataRate", DataRateValue(rate));
        // Zero delay: a frame holds the medium only while it is serialised, as on
        // the rate-shaped loopback that `shared` stands for (carrier sense would
        // otherwise hold it a propagation delay more per frame). Receivers add
        // the delay instead.
        csma.SetChannelAttribute("Delay", TimeValue(Seconds(0)));
        csma.SetDeviceAttribute("Mtu", UintegerValue(9000));
        csma.SetQueue("ns3::DropTailQueue", "MaxSize", QueueSizeValue(one_packet));
        NodeContainer members;
        for (size_t i = 0; i < nl; i++)
        {
            members.Add(nodes.Get(p.link_a[i]));
        }
        NetDeviceContainer devs = csma.Install(members);
        for (size_t i = 0; i < nl; i++)
        {
            Ptr<CsmaNetDevice> d = DynamicCast<CsmaNetDevice>(devs.Get(i));
            // A slot of 8 bit times, at least 1 ns (ns-3's resolution: a
            // zero slot retries forever at one instant): the medium stands
            // for a rate-shaped queue (tbf), which idles no slot between
            // frames. Never give up on a busy medium. The definition takes
            // (ceiling, maxRetries), whatever the header says.
            double slot = std::max(1e-9, 8.0 / p.rate_bps);
            d->SetBackoffParams(Seconds(slot), 1, 1023, 10, 1000000000);
            dev[2 * i] = d;
        }
    }
    else
    {
        PointToPointHelper p2p;
        p2p.SetDeviceAttribute("DataRate", DataRateValue(rate));
        p2p.SetDeviceAttribute("Mtu", UintegerValue(9000));
        p2p.SetChannelAttribute("Delay", TimeValue(delay));
        p2p.SetQueue("ns3::DropTailQueue", "MaxSize", QueueSizeValue(one_packet));
        for (size_t i = 0; i < nl; i++)
        {
            NetDeviceContainer pair =
                p2p.Install(nodes.Get(p.link_a[i]), nodes.Get(p.link_b[i]));
            dev[2 * i] = pair.Get(0);
            dev[2 * i + 1] = pair.Get(1);
        }
    }

    // addresses, queue discs, counters
    uint32_t nq = 0;
    c.qdiscs.clear();
    c.devqueues.clear();
    for (size_t k = 0; k < 2 * nl; k++)
    {
        if (!dev[k])
        {
            continue;
        }
        int32_t n = (k % 2) ? p.link_b[k / 2] : p.link_a[k / 2];
        Ptr<Ipv4> ipv4 = nodes.Get(n)->GetObject<Ipv4>();
        uint32_t ifi = ipv4->AddInterface(dev[k]);
        Ipv4InterfaceAddress ifa(Ipv4Address(p.link_addr[k]), Ipv4Mask(p.link_mask));
        ipv4->AddAddress(ifi, ifa);
        ipv4->SetUp(ifi);
        ifindex[k] = ifi;
        TrafficControlHelper tch;
        bool sw = p.is_switch[n];
        uint32_t packet = p.payload_bytes + p.header_bytes;
        std::string limit = std::to_string(p.queue_limit_bytes) + "B";
        if (sw)
        {
            // step marking: instantaneous queue (QW=1), MinTh = MaxTh, no gentle ramp
            tch.SetRootQueueDisc("ns3::RedQueueDisc",
                                 "MaxSize", QueueSizeValue(QueueSize(limit)),
                                 "UseEcn", BooleanValue(true),
                                 "UseHardDrop", BooleanValue(false),
                                 "Gentle", BooleanValue(false),
                                 "QW", DoubleValue(1.0),
                                 "MeanPktSize", UintegerValue(packet),
                                 "MinTh", DoubleValue(double(p.ecn_threshold_bytes)),
                                 "MaxTh", DoubleValue(double(p.ecn_threshold_bytes)));
        }
        else
        {
            tch.SetRootQueueDisc("ns3::FifoQueueDisc",
                                 "MaxSize", QueueSizeValue(QueueSize(limit)));
        }
        QueueDiscContainer qdc = tch.Install(dev[k]);
        Ptr<QueueDisc> qd = qdc.Get(0);
        c.all_qdiscs.push_back(qd);
        Ptr<Queue<Packet>> devq;
        if (p.shared)
        {
            devq = DynamicCast<CsmaNetDevice>(dev[k])->GetQueue();
        }
        else
        {
            devq = DynamicCast<PointToPointNetDevice>(dev[k])->GetQueue();
        }
        auto count = MakeBoundCallback(&CountTx, uint32_t(k));
        dev[k]->TraceConnectWithoutContext("PhyTxBegin", count);
        dev[k]->TraceConnectWithoutContext("PhyTxDrop", MakeCallback(&CountDrop));
        dev[k]->TraceConnectWithoutContext("MacTxDrop", MakeCallback(&CountDrop));
        c.all_devqueues.push_back(devq);
        if (sw)
        {
            c.qdiscs.push_back(qd);
            c.devqueues.push_back(devq);
            auto watch = MakeBoundCallback(&WatchQueue, nq);
            qd->TraceConnectWithoutContext("BytesInQueue", watch);
            devq->TraceConnectWithoutContext("BytesInQueue", watch);
            nq++;
        }
    }
    p.queue_peak.assign(nq, 0);
    for (size_t i = 0; i < p.local_node.size(); i++)
    {
        Ptr<Ipv4> ipv4 = nodes.Get(p.local_node[i])->GetObject<Ipv4>();
        Ipv4Address addr(p.local_addr[i]);
        ipv4->AddAddress(1, Ipv4InterfaceAddress(addr, Ipv4Mask("255.255.255.255")));
    }
    Ipv4StaticRoutingHelper srh;
    for (size_t i = 0; i < p.route_node.size(); i++)
    {
        int32_t n = p.route_node[i], l = p.route_link[i];
        size_t k = (p.link_a[l] == n) ? 2 * l : 2 * l + 1;
        Ptr<Ipv4> ipv4 = nodes.Get(n)->GetObject<Ipv4>();
        Ipv4Address addr(p.route_addr[i]);
        srh.GetStaticRouting(ipv4)->AddHostRouteTo(addr, ifindex[k]);
    }
    for (uint32_t n = 0; n < uint32_t(p.num_nodes); n++)
    {
        Ptr<Ipv4L3Protocol> ip = nodes.Get(n)->GetObject<Ipv4L3Protocol>();
        ip->TraceConnectWithoutContext("Drop", MakeCallback(&CountIpDrop));
    }
    if (p.shared)
    {
        NeighborCacheHelper().PopulateNeighborCache();
    }

    // apps on every node with a device, then the task graph
    c.apps.assign(p.num_nodes, nullptr);
    for (size_t k = 0; k < 2 * nl; k++)
    {
        int32_t n = (k % 2) ? p.link_b[k / 2] : p.link_a[k / 2];
        if (dev[k] && !c.apps[n])
        {
            Ptr<GwApp> app = CreateObject<GwApp>();
            app->node = n;
            nodes.Get(n)->AddApplication(app);
            app->Setup();
            c.apps[n] = app;
        }
    }
    c.pending.assign(nt, 0);
    c.rx_bytes.assign(nt, 0);
    c.last_cnp.assign(nt, -1.0);
    c.succ_ptr.assign(nt + 1, 0);
    for (size_t t = 0; t < nt; t++)
    {
        c.pending[t] = p.dep_ptr[t + 1] - p.dep_ptr[t];
        for (int32_t k = p.dep_ptr[t]; k < p.dep_ptr[t + 1]; k++)
        {
            c.succ_ptr[p.dep_idx[k] + 1]++;
        }
    }
    for (size_t t = 0; t < nt; t++)
    {
        c.succ_ptr[t + 1] += c.succ_ptr[t];
    }
    c.succ_idx.assign(c.succ_ptr[nt], 0);
    std::vector<int32_t> fill(c.succ_ptr.begin(), c.succ_ptr.end() - 1);
    for (size_t t = 0; t < nt; t++)
    {
        for (int32_t k = p.dep_ptr[t]; k < p.dep_ptr[t + 1]; k++)
        {
            c.succ_idx[fill[p.dep_idx[k]]++] = int32_t(t);
        }
    }
    for (size_t t = 0; t < nt; t++)
    {
        if (c.pending[t] == 0)
        {
            Simulator::Schedule(Seconds(0), &Controller::Begin, &c, uint32_t(t));
        }
    }
    if (nq > 0)
    {
        Simulator::Schedule(Seconds(0), &Controller::Sample, &c);
    }
    Simulator::Run();
    for (auto& qd : c.all_qdiscs)
    {
        const QueueDisc::Stats& st = qd->GetStats();
        p.drops += st.nTotalDroppedPackets;
        p.queue_drops += st.nTotalDroppedPackets;
    }
    for (auto& q : c.all_devqueues)
    {
        p.drops += q->GetTotalDroppedPackets();
        p.queue_drops += q->GetTotalDroppedPackets();
    }
    Simulator::Destroy();
    c = Controller();
    c.plan = &p;
}

// Python hands numpy buffers over through these (no per-element crossing).
template <typename T>
void Fill(std::vector<T>& v, const T* x, size_t n)
{
    v.assign(x, x + n);
}

template <typename T>
void Take(const std::vector<T>& v, T* out)
{
    std::copy(v.begin(), v.end(), out);
}

} // namespace graphwire_ns3
"""
