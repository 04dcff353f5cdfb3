"""Sweep specs: axes, workloads and points as data; bad input refused naming file and field."""
import subprocess
import sys
from pathlib import Path

import pytest

from kbtorch.sweep.spec import SpecError, load_spec

TINY = str(Path(__file__).parent / "data" / "tiny.toml")


def _spec(tmp_path, body: str, name="study.toml", head=""):
    p = tmp_path / name
    p.write_text(f'[sweep]\ntopology = "{TINY}"\n{head}' + body)
    return p


GEMM = '[workloads.g]\nop = "gemm"\nm = 64\nn = 64\nk = 64\n'


def test_cross_product_and_scale(tmp_path):
    spec = load_spec(_spec(tmp_path, '[axes]\nlinks.noc.bw_gbps = [128, 256]\n'
                           'hbm = { paths = ["components.hbm_slice.channel_gbps", "links.hbm.bw_gbps"], scale = [0.5, 2] }\n'
                           + GEMM + 'composite = [true, false]\n'))
    assert len(spec.points) == 2 * 2 * 2
    p = spec.points[0]
    assert dict(p.overrides) == {"links.noc.bw_gbps": 128, "components.hbm_slice.channel_gbps": 64.0,
                                 "links.hbm.bw_gbps": 128.0}
    assert dict(p.params)["composite"] is True and dict(p.axes)["hbm"] == 0.5
    assert [a.name for a in spec.axes] == ["links.noc.bw_gbps", "hbm"]
    assert spec.base(spec.axes[0]) == 256 and spec.base(spec.axes[1]) == 0.5


def test_explicit_points(tmp_path):
    spec = load_spec(_spec(tmp_path, GEMM + '[[points]]\nworkload = "g"\n"issue.fixed_cycles" = 80\n'
                           '[[points]]\nworkload = "g"\n'))
    assert [dict(p.overrides) for p in spec.points] == [{"issue.fixed_cycles": 80}, {}]


@pytest.mark.parametrize("body, field", [
    ('[axes]\nlinks.noc.bw_gbs = [1, 2]\n' + GEMM, "axes.links.noc.bw_gbs"),
    ('[axes]\nlinks.noc.bw_gbps = [-1, 2]\n' + GEMM, "axes.links.noc.bw_gbps"),
    ('[axes]\nlinks.noc.bw_gbps = []\n' + GEMM, "axes.links.noc.bw_gbps"),
    ('[axes]\ntopology = ["nosuch"]\n' + GEMM, "axes.topology"),
    ('[axes]\nx = { path = "links.noc.bw_gbps", scale = [0] }\n' + GEMM, "axes.x.scale"),
    ('[workloads.g]\nop = "gemmm"\n', "workloads.g.op"),
    ('[workloads.g]\nop = "gemm"\nm = 1\nn = 1\n', "workloads.g.k"),
    (GEMM + 'tile = 3\n', "workloads.g.tile"),
    (GEMM + 'dtype = "f17"\n', "workloads.g.dtype"),
    (GEMM + 'bogus = 1\n', "workloads.g.bogus"),
    ('[workloads.f]\nfn = "no_such_module:fn"\n', "workloads.f.fn"),
    ('', "workloads"),
    ('[axis]\n' + GEMM, "axis"),
    (GEMM + '[[points]]\nworkload = "h"\n', "points[0].workload"),
])
def test_bad_specs_name_file_and_field(tmp_path, body, field):
    with pytest.raises(SpecError, match=rf"^study\.toml: {field.replace('.', '[.]').replace('[0]', '.0.')}"):
        load_spec(_spec(tmp_path, body))


def test_unreadable_and_bad_toml(tmp_path):
    with pytest.raises(SpecError, match="nope.toml: file"):
        load_spec(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[sweep\n")
    with pytest.raises(SpecError, match="bad.toml: file: not valid TOML"):
        load_spec(tmp_path / "bad.toml")


def test_import_kbtorch_does_not_import_the_sweep_extra():
    # NOTE: tqdm is left out: torch itself imports it.
    code = "import sys, kbtorch, kbtorch.cli; print(sorted(m for m in ('dask', 'distributed', 'pandas', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_one_at_a_time(tmp_path):
    spec = load_spec(_spec(tmp_path, head='combine = "one_at_a_time"\n', body='[axes]\nlinks.noc.bw_gbps = [128, 256, 512]\n'
                           '"issue.fixed_cycles" = { path = "issue.fixed_cycles", scale = [0.5, 1, 2] }\n' + GEMM))
    shown = [dict(p.axes) for p in spec.points]
    assert shown == [{"links.noc.bw_gbps": 256, "issue.fixed_cycles": 1.0}, {"links.noc.bw_gbps": 128, "issue.fixed_cycles": 1.0},
                     {"links.noc.bw_gbps": 512, "issue.fixed_cycles": 1.0}, {"links.noc.bw_gbps": 256, "issue.fixed_cycles": 0.5},
                     {"links.noc.bw_gbps": 256, "issue.fixed_cycles": 2.0}]


def test_a_shipped_study_by_name_and_its_store_in_the_working_directory(tmp_path, monkeypatch):
    from kbtorch.sweep.runner import default_store
    from kbtorch.sweep.spec import STUDY_DIR
    spec = load_spec("gemm_composite")
    assert Path(spec.path) == STUDY_DIR / "gemm_composite.toml" and spec.name == "gemm_composite"
    monkeypatch.chdir(tmp_path)
    assert default_store(spec) == str(tmp_path / "gemm_composite.sqlite")
    assert default_store(load_spec(_spec(tmp_path, GEMM))) == str(tmp_path / "study.sqlite")
    with pytest.raises(SpecError, match=r"no_such_study: file: no such spec file nor shipped study \(shipped: .*gemm_composite"):
        load_spec("no_such_study")


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(__file__).parents[1] / "kbtorch" / "studies").glob("*.toml")))
def test_every_shipped_study_loads(name):
    assert load_spec(name).points


SYSTEM = str(Path(__file__).parent / "data" / "tiny_system.toml")
AR = '[workloads.ar]\nop = "all_reduce"\ngroup = "all"\nnbytes = "64KiB"\nmode = "coarse"\n'


def _system_spec(tmp_path, axes: str):
    return _spec(tmp_path, f"[axes]\n{axes}\n" + AR).read_text().replace(TINY, SYSTEM)


def test_a_system_topology_with_system_and_chip_axes(tmp_path):
    (tmp_path / "s.toml").write_text(_system_spec(
        tmp_path, '"system.trays" = [1, 2]\nnoc = { path = "chip.links.noc.bw_gbps", scale = [0.5, 2] }'))
    spec = load_spec(tmp_path / "s.toml")
    assert spec.topology == SYSTEM and len(spec.points) == 4
    # NOTE: a scale of a chip field multiplies the chip file's value (tinychip: noc 256 GB/s).
    assert [dict(p.overrides) for p in spec.points[:2]] == [{"system.trays": 1, "chip.links.noc.bw_gbps": 128.0},
                                                          {"system.trays": 1, "chip.links.noc.bw_gbps": 512.0}]
    assert spec.base(spec.axes[0]) == 2
    by_name = load_spec(_both(tmp_path))
    assert {Path(p.topology).stem for p in by_name.points} == {"tiny_system", "tiny"}


def _both(tmp_path):
    p = tmp_path / "both.toml"
    p.write_text(f'[sweep]\ntopology = "{SYSTEM}"\n[axes]\ntopology = ["{SYSTEM}", "{TINY}"]\n' + AR)
    return p


@pytest.mark.parametrize("axes, field, message", [
    ('"system.trayz" = [1, 2]', "axes.system.trayz", r"no entry 'trayz' in system \(did you mean 'trays'\?\)"),
    ('"system.trays" = [0, 2]', "axes.system.trays", r"positive integer, got 0 .*on topology 'tiny_system'"),
    ('"chip.links.nocc.bw_gbps" = [1, 2]', "axes.chip.links.nocc.bw_gbps", r"no entry 'nocc'.*chip file tinychip.toml"),
    ('"chip.links.noc.bw_gbps" = [-1, 2]', "axes.chip.links.noc.bw_gbps", r"positive number, got -1 .*'tiny_system'"),
])
def test_a_bad_system_field_is_refused_by_name(tmp_path, axes, field, message):
    (tmp_path / "s.toml").write_text(_system_spec(tmp_path, axes))
    with pytest.raises(SpecError, match=rf"s\.toml: {field}: .*{message}"):
        load_spec(tmp_path / "s.toml")
