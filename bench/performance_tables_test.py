"""bench/performance_tables.py on small fabricated inputs: the best cell
over repeats, the spread over every run, blobpipe / best ZeroMQ, the
largest blob, and the Python rows beside pyzmq."""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import performance_tables as pt  # noqa: E402

HEADER = "workload,entry_bytes,entries,column,blob_entries,seconds_best,seconds_worst,entries_per_s,gb_per_s\n"


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def run(*argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert pt.main(list(argv)) == 0
    return buf.getvalue()


def rows(md, heading):
    """{first cell: [cells]} of the table under `### heading`."""
    block = md.split(f"### {heading}\n", 1)[1].split("### ", 1)[0]
    out = {}
    for line in block.splitlines():
        if line.startswith("| ") and not line.startswith("| |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0]] = cells[1:]
    return out


def test_best_over_repeats_spread_over_every_run_and_ratio_to_the_best_zeromq(tmp_path):
    a = write(tmp_path, "a.csv", HEADER +
              "64 B,64,1000,blobpipe tcp,5,2.0,2.2,500,0.0320\n"
              "64 B,64,1000,blobpipe tcp,1000,1.0,1.1,1000,0.0640\n"
              "64 B,64,1000,zeromq defaults,0,0.5,0.6,2000,0.1280\n"
              "64 B,64,1000,zeromq tuned,0,0.8,0.9,1250,0.0800\n")
    b = write(tmp_path, "b.csv", HEADER +
              "64 B,64,1000,blobpipe tcp,1000,0.8,1.2,1250,0.0800\n")
    md = run("--csv", a, "--csv", b)
    r = rows(md, "64 B")
    assert list(r) == ["blobpipe over TCP (blobs of 1,000)", "ZeroMQ defaults", "ZeroMQ tuned"]
    tcp = r["blobpipe over TCP (blobs of 1,000)"]
    assert tcp[0] == "1,250"          # the best of both CSVs
    assert tcp[2] == "1.50"           # slowest 1.2 s over fastest 0.8 s
    assert tcp[3] == "0.62×"          # 1,250 over ZeroMQ's best, 2,000
    assert r["ZeroMQ defaults"][3] == ""
    assert "### 1 KiB" not in md      # not measured: no table


def test_printed_output_gives_the_best_without_a_spread(tmp_path):
    t = write(tmp_path, "raw.txt",
              "[16 MiB] 192 entries, 3.22 GB\n"
              "  blobpipe tcp           blob 192          243 /s   4.07 GB/s\n"
              "  zeromq tuned                             117 /s   1.97 GB/s\n"
              "  raw socket landing                       143 /s   2.39 GB/s\n")
    r = rows(run("--text", t), "16 MiB")
    assert r["blobpipe over TCP (blobs of 192)"] == ["243", "4.07", "–", "2.08×"]
    assert r["raw socket landing"][:2] == ["143", "2.39"]


def test_python_rows_stand_beside_pyzmq(tmp_path):
    s = write(tmp_path, "stream.txt",
              "    64 B      Python emit +value               400,000.00 entries/s spread 1.10  consumer 2 sender 2 us\n"
              "    64 B      pyzmq send                       100,000.00 entries/s spread 1.20  consumer 5 sender 6 us\n"
              "    RL sample pyzmq send_multipart              30,000.00 samples/s spread 1.04  consumer 6 sender 6 us\n"
              "    RL sample Python send_blob +value           27,000.00 samples/s spread 1.08  consumer 6 sender 6 us\n"
              "    16 MiB    Python emit copy=False +value          3.00 GB/s      spread 1.24  consumer 4 sender 4 us\n"
              "    16 MiB    pyzmq copy=False                       2.00 GB/s      spread 2.22  consumer 4 sender 5 us\n")
    md = run("--python-stream", s)
    r = rows(md, "64 B")
    assert r["blobpipe Python emit +value"] == ["400,000", "–", "1.10", "4.00×"]
    assert r["pyzmq send"][3] == ""
    rl = rows(md, "RL sample")
    assert rl["blobpipe Python send_blob +value, samples/s"][3] == "0.90×"
    big = rows(md, "16 MiB")["blobpipe Python emit copy=False +value"]
    assert big[1] == "3.00" and big[3] == "1.50×"


def test_the_merged_csv_keeps_the_best_cell_for_the_plot(tmp_path):
    a = write(tmp_path, "a.csv", HEADER + "1 MiB,1048576,3000,raw socket,0,1.0,1.5,3000,3.1000\n")
    b = write(tmp_path, "b.csv", HEADER + "1 MiB,1048576,3000,raw socket,0,0.9,1.0,3333,3.5000\n")
    m = tmp_path / "m.csv"
    run("--csv", a, "--csv", b, "--merged-csv", str(m))
    lines = m.read_text().splitlines()
    assert lines[0] == HEADER.strip()
    assert lines[1].split(",")[3:] == ["raw socket", "0", "0.9", "1.5", "3333", "3.5000"]


def test_a_csv_that_is_not_entry_sizes_output_is_refused_naming_the_line(tmp_path, capsys):
    missing = write(tmp_path, "missing.csv", "workload,column\n64 B,blobpipe tcp\n")
    assert pt.main(["--csv", missing]) == 2
    assert f"{missing}:2: not an entry_sizes --csv row" in capsys.readouterr().err
    zero = write(tmp_path, "zero.csv", HEADER + "64 B,64,1000,raw socket,0,0,0,1000,0.0640\n")
    assert pt.main(["--csv", zero]) == 2
    assert f"{zero}:2: seconds_best 0.0 and seconds_worst 0.0 are not 0 < best <= worst" in capsys.readouterr().err
