"""InfiniBand/RoCE sysfs reader: words → bytes, rates between reads, resets, bad files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import DATA

from collector.sources.infiniband import InfinibandReader, counter_rate

SYSFS = DATA / "sysfs_ib"
S = 1_000_000_000


@pytest.fixture
def root(tmp_path: Path) -> Path:
    dest = tmp_path / "infiniband"
    shutil.copytree(SYSFS / "infiniband", dest)
    return dest


def _set(root: Path, device: str, rel: str, value: int | str) -> None:
    (root / device / "ports" / "1" / rel).write_text(f"{value}\n")


def _values(parsed: object, device: str, metric: str) -> tuple[float, float | None]:
    df = parsed.tables["fabric_samples"]  # type: ignore[attr-defined]
    row = df.filter((df["device"] == device) & (df["metric"] == metric)).row(0, named=True)
    return row["value"], row["rate_per_s"]


def test_words_become_bytes_and_rates_are_exact(root: Path) -> None:
    reader = InfinibandReader(root, host="gpu-node-1")
    assert reader.available()[0]
    first = reader.read(10 * S)
    assert _values(first, "mlx5_0", "tx_bytes") == (1_000_000 * 4, None)  # first read: no rate
    _set(root, "mlx5_0", "counters/port_xmit_data", 1_000_000 + 2_500_000)  # +2.5 M words
    _set(root, "mlx5_0", "counters/port_rcv_data", 2_000_000 + 500_000)
    _set(root, "mlx5_0", "hw_counters/np_ecn_marked_roce_packets", 42 + 300)
    second = reader.read(12 * S)  # 2 s later
    assert _values(second, "mlx5_0", "tx_bytes") == (3_500_000 * 4, 2_500_000 * 4 / 2)  # 5 MB/s
    assert _values(second, "mlx5_0", "rx_bytes") == (2_500_000 * 4, 1_000_000.0)
    assert _values(second, "mlx5_0", "np_ecn_marked_roce_packets") == (342, 150.0)
    assert _values(second, "mlx5_0", "rp_cnp_handled") == (7, 0.0)
    assert _values(second, "mlx5_0", "link_rate_bytes_per_s") == (200e9 / 8, None)
    df = second.tables["fabric_samples"]
    assert set(df["host"]) == {"gpu-node-1"} and set(df["port"]) == {1}
    assert set(df["device"]) == {"mlx5_0", "mlx5_1"}


def test_counter_reset_gives_null_rate_not_negative(root: Path) -> None:
    reader = InfinibandReader(root)
    reader.read(1 * S)
    _set(root, "mlx5_1", "counters/port_xmit_data", 5)  # driver reload: counter restarted
    after = reader.read(2 * S)
    assert _values(after, "mlx5_1", "tx_bytes") == (20, None)
    _set(root, "mlx5_1", "counters/port_xmit_data", 105)
    assert _values(reader.read(3 * S), "mlx5_1", "tx_bytes") == (420, 400.0)


def test_bad_counter_file_is_a_problem_others_kept(root: Path) -> None:
    _set(root, "mlx5_1", "counters/symbol_error", "N/A")
    parsed = InfinibandReader(root).read(S)
    assert [p.location.endswith("mlx5_1/ports/1/counters/symbol_error") for p in parsed.problems] == [True]
    assert _values(parsed, "mlx5_1", "link_downed") == (1, None)


def test_absent_root_is_unavailable_with_reason(tmp_path: Path) -> None:
    ok, why = InfinibandReader(tmp_path / "nothing").available()
    assert not ok and "does not exist" in why
    assert InfinibandReader(tmp_path / "nothing").read(S).tables == {}


def test_counter_rate_rules() -> None:
    assert counter_rate(10, 0, 30, 2 * S) == 10.0
    assert counter_rate(10, 0, 5, 2 * S) is None
    assert counter_rate(10, S, 20, S) is None
