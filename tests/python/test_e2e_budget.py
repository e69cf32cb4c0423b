"""bench/e2e/budget.py's host-side parts, without a GPU: the split of a profiled step by kind (idle time
included), the join of evt's plan groups with the profiled GEMM kernels (by namespace hash, and by the mangled
name's digest for CUTLASS kernels), and the table it renders."""
import pytest

from bench_module import load

pytest.importorskip("torch")

HEX_A, HEX_B = "0123456789abcdef", "fedcba9876543210"
MANGLED = "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEE"


@pytest.fixture(scope="module")
def budget():
    return load("bench/e2e/budget.py", "e2e_budget")


EVENTS = [("void at::native::vectorized_elementwise_kernel<4>", 0.0, 10.0),
          (f"void cutlass::device_kernel<evt_gen_{HEX_A}::GemmKernel>", 12.0, 112.0),
          (MANGLED, 112.0, 162.0),
          ("nvjet_hsh_128x256_64x4", 162.0, 212.0),
          ("Memcpy DtoD (Device -> Device)", 215.0, 220.0),
          (f"void evt_gen_{HEX_B}::row_kernel<4, 8, 1, false>(Params)", 220.0, 240.0)]
GROUPS = [dict(kind="gemm+evt", path="generated", kernel=f"evt_kernel_{HEX_A}", m=64, n=128, k=256, ops="mm+add",
               io_bytes=100),
          dict(kind="gemm+evt", path="generated", kernel="evt_kernel_1111222233334444", m=32, n=32, k=32, ops="mm",
               io_bytes=100),
          dict(kind="row", path="generated", kernel=f"evt_rows_{HEX_B}", m=8, n=16, k=0, ops="add", io_bytes=3 * 10**9)]


def test_split_by_kind_and_idle(budget):
    by, aten = budget.split_by_kind(EVENTS)
    assert by["GEMM"] == pytest.approx([0.2, 3])
    assert by["row / pointwise / reduction"] == pytest.approx([0.03, 2])
    assert by["copy / cast / transpose"] == pytest.approx([0.005, 1])
    assert by["idle in the step"][0] == pytest.approx(0.005)  # the gaps 10-12 and 212-215 us
    assert aten == pytest.approx([0.01, 1])


def test_gemm_table_joins_by_hash_and_mangled_digest(budget, monkeypatch):
    digest = budget.R._cutlass_digest(MANGLED)
    monkeypatch.setattr(budget.R, "_cutlass_names", lambda dirs: {digest: "evt_kernel_1111222233334444"})
    monkeypatch.setattr(budget, "cublas_ms", lambda m, n, k: m * n * k / 1e7)
    rows = {r["kernel"]: r for r in budget.gemm_table(GROUPS, EVENTS)}
    assert set(rows) == {HEX_A, "1111222233334444"}
    assert rows[HEX_A]["ms"] == pytest.approx(0.1) and rows[HEX_A]["shapes"] == [[64, 128, 256]]
    assert rows["1111222233334444"]["ms"] == pytest.approx(0.05)
    assert budget.row_floor_ms(GROUPS, 3000.0) == pytest.approx(1.0)  # 3 GB at 3000 GB/s


def test_plan_device_bytes_sums_every_segment(budget):
    seg = lambda a, s: {"plan": {"arena_bytes": a, "scratch_bytes": s, "groups": []}}  # noqa: E731
    report = type("R", (), {"modules": [{"segments": [seg(100, 20), {"plan": None}]}, {"segments": [seg(5, 0)]}]})
    assert budget.plan_device_bytes(report) == 125


def test_render_names_every_kind_and_the_floors(budget, monkeypatch):
    monkeypatch.setattr(budget, "cublas_ms", lambda m, n, k: 0.05)
    by, aten = budget.split_by_kind(EVENTS)
    mode = dict(ms=1.0, peak_gib=1.0, device_gib=2.0, compile_cold_s=2.0, kinds={k: list(v) for k, v in by.items()},
                aten=aten)
    res = dict(workload="w", device="gpu", torch="t", rates=dict(gemm_tflops=700.0, copy_gbs=3000.0), dropout=True,
               flops=[7e11, 0], modes={"evt": dict(mode, row_floor_ms=0.5, arena_gib=1.5,
                                                   gemms=budget.gemm_table(GROUPS, EVENTS)),
                                       "inductor": dict(error="RuntimeError: no GPU"), "eager": mode})
    text = budget.render(res, "python3 bench/e2e/budget.py --workloads w")
    for kind in budget.KINDS:
        assert f"| {kind} |" in text
    assert "| GEMM | 0.20 (3) | — | 0.20 (3) | 1.00 |" in text  # 0.7 TFLOP at 700 TFLOP/s
    assert "RuntimeError: no GPU" in text and "2.00x" in text
    assert "| sum of evt's arenas (PyTorch's pool, per run) + GEMM scratch GiB | 1.50 |" in text
