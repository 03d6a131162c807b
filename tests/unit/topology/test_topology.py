"""Loading, validation and the queries the engine and the controller use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.domain.errors import InvalidInput, NotFound
from gpufleet.domain.topology import dump_topology, load_topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72

SMALL = {
    "format": "gpufleet.topology/v1",
    "components": [
        {"id": "r01", "kind": "rack", "parent": None, "serial": "RACK-1"},
        {"id": "r01-n01", "kind": "node", "parent": "r01", "serial": "N-1"},
        {"id": "r01-n01-gpu0", "kind": "gpu", "parent": "r01-n01", "serial": "1654922006281"},
        {"id": "r01-n01-nic0", "kind": "nic", "parent": "r01-n01", "serial": "MT-1"},
        {"id": "leaf-su1-r0", "kind": "leaf_switch", "parent": None, "serial": "SW-1"},
    ],
    "links": [{"id": "r01-n01-nic0~leaf-su1-r0", "kind": "ib", "a": "r01-n01-nic0", "b": "leaf-su1-r0"}],
}


def _doc(**changes: object) -> str:
    doc = json.loads(json.dumps(SMALL))
    doc.update(changes)
    return json.dumps(doc)


def test_load_from_text_and_path(tmp_path: Path) -> None:
    topo = load_topology(json.dumps(SMALL))
    assert topo.component("r01-n01-gpu0").serial == "1654922006281"
    p = tmp_path / "t.json"
    p.write_text(json.dumps(SMALL))
    assert set(load_topology(p).components) == set(topo.components)
    assert set(load_topology(str(p)).links) == {"r01-n01-nic0~leaf-su1-r0"}


def test_round_trip_of_a_generated_topology() -> None:
    topo = generate_nvl72(1)
    again = load_topology(dump_topology(topo))
    assert again.components == topo.components
    assert again.links == topo.links


@pytest.mark.parametrize(
    ("mutate", "field", "value"),
    [
        (lambda d: d["components"][2].update(kind="gpu_board"), "components[2].kind", "gpu_board"),
        (lambda d: d["components"][2].update(parent="r09-n09"), "components[2].parent", "r09-n09"),
        (lambda d: d["links"][0].update(b="leaf-su9-r0"), "links[0].b", "leaf-su9-r0"),
        (lambda d: d["components"].append(dict(d["components"][1])), "components[5].id", "r01-n01"),
        (lambda d: d["links"].append(dict(d["links"][0])), "links[1].id", "r01-n01-nic0~leaf-su1-r0"),
        (lambda d: d.update(format="gpufleet.topology/v2"), "format", "gpufleet.topology/v2"),
        (lambda d: d["components"][0].update(parent="r01-n01"), "components[0].parent", "r01-n01"),
        (lambda d: d["components"][1].update(color="red"), "components[1].color", "red"),
    ],
)
def test_malformed_topology_is_rejected_with_field_and_value(mutate: object, field: str, value: str) -> None:
    doc = json.loads(json.dumps(SMALL))
    assert callable(mutate)
    mutate(doc)
    with pytest.raises(InvalidInput) as err:
        load_topology(json.dumps(doc))
    assert err.value.field == field
    assert err.value.value == value
    assert field in str(err.value)


def test_invalid_json_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="valid JSON"):
        load_topology('{"format": ')
    with pytest.raises(NotFound):
        load_topology(tmp_path / "absent.json")


def test_queries_on_hgx() -> None:
    topo = generate_hgx(64)
    assert topo.ancestors("r02-n03-gpu5") == ("r02-n03", "r02")
    assert topo.node_of("r02-n03-gpu5") == "r02-n03"
    assert topo.node_of("r02-n03") == "r02-n03"
    assert topo.node_of("leaf-su1-r5") is None
    # A leaf serves rail 5 of the 32 nodes of its scalable unit (racks r01..r08, 4 nodes each).
    behind = topo.nodes_behind("leaf-su1-r5")
    assert len(behind) == 32
    assert {n.split("-")[0] for n in behind} == {f"r{i:02d}" for i in range(1, 9)}
    assert topo.nodes_behind("spine-r5-1") == ()
    assert topo.nodes_behind("r02-n03-nic5~leaf-su1-r5") == ("r02-n03",)
    assert topo.nodes_behind("r02-n03-nvsw1") == ("r02-n03",)
    assert len(topo.nodes_behind("r02")) == 4
    with pytest.raises(NotFound):
        topo.component("r99-n01")


def test_queries_on_nvl72() -> None:
    topo = generate_nvl72(2)
    assert topo.node_of("r02-ct04-gpu1") == "r02-ct04"
    assert topo.unit_of("r02-sw3-nvsw1") == "r02-sw3"
    assert topo.node_of("r02-sw3-nvsw1") is None
    chip_hosts = topo.nodes_behind("r02-sw3-nvsw1")
    assert chip_hosts == tuple(f"r02-ct{i:02d}" for i in range(1, 19))
    assert topo.nodes_behind("r02-sw3") == chip_hosts
    assert set(topo.descendants("r01-ct01")) == {f"r01-ct01-gpu{i}" for i in range(4)} | {
        f"r01-ct01-nic{i}" for i in range(4)
    }


def test_to_fleet_names_the_same_racks_and_leaves() -> None:
    from gpufleet.domain.topology import to_fleet

    topo = generate_hgx(40)
    fleet = to_fleet(topo)
    assert len(fleet) == 40
    node = fleet.nodes["r03-n02"]
    assert node.rack == "r03"
    assert [g.slot for g in node.gpus] == [f"r03-n02-gpu{i}" for i in range(8)]
    assert node.gpus[5].serial == topo.components["r03-n02-gpu5"].serial
    assert node.leaves == {f"leaf-su1-r{i}" for i in range(8)}
    assert "switch:leaf-su1-r5" in node.domains and "rack:r03" in node.domains
    # the leaf's failure domain holds exactly the nodes the topology puts behind it
    assert fleet.domain_members()["switch:leaf-su2-r5"] == frozenset(topo.nodes_behind("leaf-su2-r5"))
    trays = to_fleet(generate_nvl72(1))
    assert len(trays) == 18 and trays.nodes["r01-ct07"].gpus[0].sku == "GB200"
