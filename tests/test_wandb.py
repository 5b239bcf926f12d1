"""train.logger=wandb (issue 37 §4): an offline W&B run gets the same scalars at the same steps as
metrics.jsonl (and so TensorBoard) and the run folder's config; a resumed training continues it; wandb is
never imported when unused, and a missing package is one line before the run folder is touched.

What offline mode writes is read back from its record file, RUN/wandb/offline-run-*/run-ID.wandb: W&B's
LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of records, each a 7-byte header
(CRC32, length, type: 1 full, 2 first, 3 middle, 4 last) and its bytes) of ``wandb_internal_pb2.Record``
protobufs."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replaid.cli import main

wandb = pytest.importorskip("wandb")
pytest.importorskip("wandb.proto.wandb_internal_pb2")

BLOCK = 32 * 1024


def records(path: Path):
    """Every Record of a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0:  # zero padding up to the block's end
            pos += BLOCK - pos % BLOCK
            continue
        buf += data[pos : pos + n]
        pos += n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def read_offline(run: Path) -> dict:
    """The offline runs under RUN/wandb/: {run id, project, name, config, history rows by step}."""
    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, sorted(p.name for p in (run / "wandb").iterdir())
    out: dict = {"ids": set(), "config": {}, "history": {}}
    for f in files:
        for rec in records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                out["ids"].add(rec.run.run_id)
                out["project"], out["name"] = rec.run.project, rec.run.display_name
                out["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
            elif kind == "config":
                out["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
            elif kind == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
                out["history"].setdefault(row["_step"], {}).update(row)
    return out


def read_settled(run: Path, last_step: int, timeout: float = 30.0) -> dict:
    """:func:`read_offline` once the file holds the run record and the history up to ``last_step``.

    wandb writes the transaction log from its own service process, and offline runs have been seen to
    reach the file incompletely at first (wandb/wandb#5561; here once in a full suite: no run record yet
    right after ``finish()``). So read again for up to ``timeout`` seconds; a record that never comes
    still fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        got = read_offline(run)
        if ("project" in got and last_step in got["history"]) or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def metrics_rows(run: Path) -> dict[int, dict]:
    rows: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.setdefault(r["step"], {}).update(
            {
                k: v
                for k, v in r.items()
                if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        )
    return rows


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # dir= (the run folder) wins over it
    for k in ("WANDB_RUN_ID", "WANDB_RESUME", "WANDB_PROJECT"):
        monkeypatch.delenv(k, raising=False)


def train(out: Path, *extra: str) -> int:
    return main(
        ["train", "--preset", "debug", "--out", str(out), "--no-progress", "train.logger=wandb", "train.log_every=5"]
        + list(extra)
    )


def test_offline_run_has_the_scalars_steps_and_config_of_the_run(offline, tmp_path):
    run = tmp_path / "run"
    assert train(run, "train.steps=10", "train.wandb_project=replaid-test") == 0
    got = read_settled(run, 10)
    assert got["project"] == "replaid-test" and got["name"] == "run"
    assert got["ids"] == {(run / "wandb" / "run-id").read_text().strip()}
    cfg = json.loads((run / "config.json").read_text())
    assert {k: v for k, v in got["config"].items() if not k.startswith("_")} == cfg  # the run folder's config
    want = metrics_rows(run)
    assert sorted(want) == [5, 10] and "eval/nelbo_nats_per_token" in want[10]
    for step, row in want.items():  # every scalar of metrics.jsonl at its step, with its value
        have = got["history"][step]
        assert {k: have.get(k) for k in row} == pytest.approx(row), step
    assert not (run / "tb").exists()  # train.logger=wandb alone: no TensorBoard
    assert not (tmp_path / "elsewhere").exists()


def test_resume_continues_the_same_wandb_run(offline, tmp_path):
    run = tmp_path / "run"
    assert train(run, "train.steps=5") == 0
    first = (run / "wandb" / "run-id").read_text()
    assert main(["train", "--out", str(run), "--resume", "--no-progress", "train.steps=10"]) == 0
    assert (run / "wandb" / "run-id").read_text() == first
    got = read_settled(run, 10)
    assert got["ids"] == {first.strip()} and sorted(got["history"]) == [5, 10]
    assert got["history"][10]["eval/nelbo_nats_per_token"] == pytest.approx(
        metrics_rows(run)[10]["eval/nelbo_nats_per_token"]
    )


def test_both_trackers_and_the_default(offline, tmp_path):
    assert train(tmp_path / "both", "train.steps=5", "train.logger=tensorboard+wandb") == 0
    assert (tmp_path / "both" / "tb").is_dir() and read_settled(tmp_path / "both", 5)["history"]
    assert main(["train", "--preset", "debug", "--out", str(tmp_path / "tb"), "--no-progress", "train.steps=5"]) == 0
    assert (tmp_path / "tb" / "tb").is_dir() and not (tmp_path / "tb" / "wandb").exists()


def test_wandb_is_not_imported_unless_asked(tmp_path):
    code = (
        "import sys; from replaid.cli import main; "
        f"assert main(['train', '--preset', 'debug', '--out', {str(tmp_path / 'run')!r}, '--no-progress', 'train.steps=2']) == 0; "
        "print(sorted(m for m in sys.modules if m == 'wandb' or m.startswith('wandb.')))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


def test_a_missing_wandb_is_one_line_before_the_folder_is_touched(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    assert train(tmp_path / "run", "train.steps=2") == 2
    err = capsys.readouterr().err
    assert "pip install 'replaid[wandb]'" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_bad_logger_names_are_refused(tmp_path, capsys):
    for bad in ("train.logger=mlflow", "train.logger=wandb+wandb", "train.logger="):
        assert main(["train", "--preset", "debug", "--out", str(tmp_path / "r"), bad]) == 2
        assert "train.logger" in capsys.readouterr().err
