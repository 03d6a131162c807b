"""``gpufleet topology``: generate and check ``gpufleet.topology/v1`` files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from gpufleet.domain.topology import Topology

_Out = Annotated[Path, typer.Option("--out", help="Where to write the JSON file.")]
_Seed = Annotated[int, typer.Option("--seed", help="Offsets the generated serial numbers.")]


def register(app: typer.Typer) -> None:
    topo_app = typer.Typer(
        help="Generate and validate fabric topologies (gpufleet.topology/v1).", no_args_is_help=True
    )
    gen_app = typer.Typer(help="Generate a reference topology.", no_args_is_help=True)
    topo_app.add_typer(gen_app, name="generate")
    app.add_typer(topo_app, name="topology")

    @gen_app.command("hgx")
    def hgx(
        nodes: Annotated[int, typer.Option("--nodes", help="HGX nodes (8 GPUs each).")],
        out: _Out,
        seed: _Seed = 0,
    ) -> None:
        """HGX H100/H200 nodes on a rail-optimised leaf/spine(/core) InfiniBand fat-tree."""
        from gpufleet.domain.topology_gen import generate_hgx

        _write(generate_hgx(nodes, seed), out)

    @gen_app.command("nvl72")
    def nvl72(
        racks: Annotated[int, typer.Option("--racks", help="GB200 NVL72 racks (72 GPUs each).")],
        out: _Out,
        seed: _Seed = 0,
    ) -> None:
        """GB200 NVL72 racks (18 compute trays, 9 switch trays) with a 4-rail fat-tree."""
        from gpufleet.domain.topology_gen import generate_nvl72

        _write(generate_nvl72(racks, seed), out)

    @topo_app.command("validate")
    def validate(path: Annotated[Path, typer.Argument(help="A gpufleet.topology/v1 file.")]) -> None:
        """Load and validate a topology file; print its component and link counts."""
        from gpufleet.domain.topology import load_topology

        topo = load_topology(path)
        typer.echo(f"{path}: valid gpufleet.topology/v1; {_counts(topo)}")


def _counts(topo: Topology) -> str:
    kinds = Counter(c.kind.value for c in topo.components.values())
    links = Counter(ln.kind for ln in topo.links.values())
    parts = [f"{n} {k}" for k, n in sorted(kinds.items())]
    parts += [f"{n} {k} links" for k, n in sorted(links.items())]
    return ", ".join(parts)


def _write(topo: Topology, out: Path) -> None:
    from gpufleet.domain.topology import dump_topology

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump_topology(topo), encoding="utf-8")
    typer.echo(f"wrote {out}: {_counts(topo)}")
