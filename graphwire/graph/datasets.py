"""Dataset specs: one string names any graph graphwire can load or make.

    synthetic:products?nodes=200000&degree=20&features=100&classes=47&seed=0
    synthetic:rmat?scale=20&edge_factor=16
    planetoid:PATH/cora          (the folder holding ind.cora.*, then the name;
                                  ?normalize_features=no keeps raw features)
    ogb:PATH                     (an OGB node-property-prediction folder)
    npz:FILE                     (arrays src, dst, x, y, split indices)
    edgelist:FILE                (lines "src dst")
    PATH                         (a folder saved in graphwire's own format)

Each scheme maps to one loader in a plain dict; options after ``?`` are passed
to it as keyword arguments (typed from the loader's config where one exists).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from graphwire.graph.graph import Graph
from graphwire.graph.synthetic import (
    ProductsConfig,
    RmatConfig,
    products_graph,
    rmat_graph,
)

__all__ = [
    "DEFAULT_SPEC",
    "check_verifiable",
    "load_dataset",
    "parse_flag",
    "parse_spec",
    "spec_paths",
]

DEFAULT_SPEC = (
    "synthetic:products?nodes=100000&degree=20&features=100&classes=47&seed=0"
)


def parse_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """Split ``scheme:target?key=value&...`` into its parts.

    A spec without a known scheme is a path (a graphwire-format folder).

    Raises:
        ValueError: an option is given twice (``nodes=10&nodes=20``).
    """
    scheme, sep, rest = spec.partition(":")
    if not sep or scheme not in _LOADERS:
        return "folder", spec, {}
    target, _, query = rest.partition("?")
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in options:
            raise ValueError(f"dataset {spec!r}: option {key!r} is given twice")
        options[key] = value
    return scheme, target, options


def spec_paths(spec: str) -> list[Path]:
    """The files or folders a spec reads (none for a synthetic graph).

    A planetoid spec ``PATH/cora`` reads the files ``PATH/ind.cora.*`` (so
    other files may be written beside them); every other scheme reads the
    path it names.
    """
    scheme, target, _ = parse_spec(spec)
    if scheme == "synthetic":
        return []
    if scheme == "planetoid":
        where = Path(target)
        return sorted(where.parent.glob(f"ind.{where.name}.*"))
    return [Path(target)]


def load_dataset(spec: str | os.PathLike[str], verify: bool = False) -> Graph:
    """Load or generate the graph a spec names (see module doc).

    A path object reads as its string does (a folder in graphwire's format).

    Args:
        spec: The dataset spec.
        verify: Check a graphwire folder's files against their SHA-256 in
            ``meta.json`` (:func:`~graphwire.graph.native.load_graph`).

    Raises:
        ValueError: with ``verify``, ``spec`` names no graphwire folder (no
            checksums are stored for another scheme's files).
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(
            f"dataset: expected a spec string or a path, found {type(spec).__name__}"
        )
    scheme, target, options = parse_spec(spec)
    if verify:
        check_verifiable(spec)
        return _folder(target, options, verify=True)
    return _LOADERS[scheme](target, options)


def check_verifiable(spec: str) -> None:
    """Refuse ``--verify`` of a ``spec`` that names no graphwire folder.

    Only graphwire folders (a graph or a partitioned one) store their files'
    SHA-256.

    Raises:
        ValueError: naming the spec's scheme.
    """
    scheme, _, _ = parse_spec(spec)
    if scheme != "folder":
        raise ValueError(
            f"--verify: --dataset {spec} is read by the {scheme} loader, which "
            "has no checksums to check; --verify checks a folder graphwire "
            "wrote (graphwire data generate, graphwire partition)"
        )


def parse_flag(value: bool | str, name: str) -> bool:
    """A yes/no option as a bool.

    A bool as it is, or ``true/false``, ``yes/no`` or ``1/0`` in any case,
    spaces around allowed (``?symmetrize=no``).

    Raises:
        ValueError: naming ``name``, for any other value (``off``, ``maybe``,
            an empty string), rather than taking it silently one way or the other.
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ValueError(f"{name}: expected true/false, yes/no or 1/0, found {value!r}")


def _typed(config_type: type, options: dict[str, str], spec_name: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(config_type)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(
            f"dataset {spec_name}: unknown option(s) {unknown}; known: {sorted(fields)}"
        )
    kwargs: dict[str, Any] = {}
    defaults = config_type()
    for key, text in options.items():
        default = getattr(defaults, key)
        try:
            kwargs[key] = _integer(text) if isinstance(default, int) else float(text)
        except ValueError as error:
            raise ValueError(
                f"dataset {spec_name}: option {key}={text!r} is not "
                f"{'an integer' if isinstance(default, int) else 'a number'}"
            ) from error
    try:
        return config_type(**kwargs)
    except ValueError as error:  # the config names the option and its value
        raise ValueError(f"dataset {spec_name}: {error}") from error


def _integer(text: str) -> int:
    """``text`` as an exact int: digits as written, or a whole number written
    with a point or an exponent (``2e3``, ``2.5e3``). Nothing goes through a
    float, which would round ``seed=9007199254740993`` (2**53 + 1) to 2**53.

    Raises:
        ValueError: ``text`` is not a whole number.
    """
    try:
        return int(text)
    except ValueError:
        # float() first: it refuses what is not a number, and turns an absurd
        # exponent (1e999999999) into inf before Decimal could expand it.
        if not math.isfinite(float(text)):
            raise ValueError(text) from None
        exact = Decimal(text.strip())
        if exact != exact.to_integral_value():
            raise ValueError(text) from None
        return int(exact)


def _synthetic(target: str, options: dict[str, str]) -> Graph:
    makers: dict[str, tuple[type, Callable[[Any], Graph]]] = {
        "products": (ProductsConfig, products_graph),
        "rmat": (RmatConfig, rmat_graph),
    }
    if target not in makers:
        raise ValueError(
            f"dataset synthetic:{target}: unknown generator; known: {sorted(makers)}"
        )
    config_type, make = makers[target]
    return make(_typed(config_type, options, f"synthetic:{target}"))


def _planetoid(target: str, options: dict[str, str]) -> Graph:
    from graphwire.graph.planetoid import load_planetoid

    path = Path(target)
    normalize = parse_flag(
        options.pop("normalize_features", True), "normalize_features"
    )
    _no_options(options, "planetoid")
    return load_planetoid(path.parent, path.name, normalize_features=normalize)


def _ogb(target: str, options: dict[str, str]) -> Graph:
    from graphwire.graph.ogb import load_ogb

    known = ["scheme", "symmetrize"]  # load_ogb's options
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"dataset ogb: unknown option(s) {unknown}; known: {known}")
    return load_ogb(target, **options)


def _npz(target: str, options: dict[str, str]) -> Graph:
    from graphwire.graph.files import load_npz

    _no_options(options, "npz")
    return load_npz(target)


def _edgelist(target: str, options: dict[str, str]) -> Graph:
    from graphwire.graph.files import load_edgelist

    text = options.pop("num_nodes", None)
    _no_options(options, "edgelist")
    num_nodes = None
    if text is not None:
        try:
            num_nodes = int(text)
        except ValueError:
            num_nodes = -1
        if num_nodes < 0:
            raise ValueError(
                f"dataset edgelist: option num_nodes={text!r} is not an int >= 0"
            )
    return load_edgelist(target, num_nodes=num_nodes)


def _folder(target: str, options: dict[str, str], verify: bool = False) -> Graph:
    path = Path(target)
    hint = _spec_hint(path)
    if not path.is_dir() or hint:
        what = "a file" if path.is_file() else "no such folder"
        if path.is_dir():
            what = "a folder of Planetoid files"
        raise ValueError(
            f"dataset {target!r}: not a known scheme "
            f"({', '.join(s for s in _LOADERS if s != 'folder')}) "
            f"and not a graphwire graph folder ({what})"
            + (f"; did you mean {hint}?" if hint else "")
        )
    from graphwire.graph.native import load_graph

    return load_graph(target, verify=verify)


def _spec_hint(path: Path) -> str | None:
    """The spec(s) a path that is not a graphwire graph folder most likely
    meant, quoted, or None: ``planetoid:PATH/NAME`` for a Planetoid name
    beside its ``ind.NAME.*`` files, for one of those files, or for a folder
    of them (without graphwire's ``meta.json``); ``npz:FILE`` for an
    ``.npz`` file."""
    if path.is_dir():
        if (path / "meta.json").exists():
            return None
        names = sorted(g.name[4:-6] for g in path.glob("ind.*.graph"))
        specs = [f"'planetoid:{path / name}'" for name in names]
        return " or ".join(specs) or None
    if (path.parent / f"ind.{path.name}.graph").is_file():
        return f"'planetoid:{path}'"
    match = re.fullmatch(
        r"ind\.(.+?)\.(?:x|tx|allx|y|ty|ally|graph|test\.index)", path.name
    )
    if path.is_file() and match:
        return f"'planetoid:{path.parent / match.group(1)}'"
    if path.suffix == ".npz" and path.is_file():
        return f"'npz:{path}'"
    return None


def _no_options(options: dict[str, str], scheme: str) -> None:
    if options:
        raise ValueError(f"dataset {scheme}: unknown option(s) {sorted(options)}")


_LOADERS: dict[str, Callable[[str, dict[str, str]], Graph]] = {
    "synthetic": _synthetic,
    "planetoid": _planetoid,
    "ogb": _ogb,
    "npz": _npz,
    "edgelist": _edgelist,
    "folder": _folder,
}
