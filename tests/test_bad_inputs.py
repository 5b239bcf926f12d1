"""The hostile-user table: every bad input ends in one line ``replaid: error: ...`` naming the
problem, exit status 2, and leaves the run folder (or the absent --out) exactly as it was."""

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from replaid.cli import main
from replaid.store import checkpoint as ck

NEW = ["train", "--preset", "debug", "--no-progress", "--out", "{new}"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("bad") / "run"
    assert (
        main(["train", "--preset", "debug", "--out", str(run), "--no-progress", "train.steps=2", "eval.max_batches=1"])
        == 0
    )
    return run


def corrupt_state_list(run):
    (ck.find_checkpoint(run) / "state.json").write_text("[1, 2]")


def corrupt_state_keys(run):
    (ck.find_checkpoint(run) / "state.json").write_text('{"step": 2}')


def corrupt_optimizer(run):
    (ck.find_checkpoint(run) / "optimizer.json").write_text("garbage{")


def corrupt_config(run):
    (run / "config.json").write_text("{not json")


def corrupt_tokenizer_spec(run):
    (run / "tokenizer" / "tokenizer_spec.json").write_text("")


def nan_weights(run):
    c = ck.find_checkpoint(run)
    for name in ("model", "ema"):
        sd = load_file(str(c / f"{name}.safetensors"))
        save_file(
            {k: torch.full_like(v, math.nan) if v.is_floating_point() else v for k, v in sd.items()},
            str(c / f"{name}.safetensors"),
        )
    st = json.loads((c / "state.json").read_text())  # consistent hashes: the non-finite check is what refuses
    st["sha256"] = {f.name: ck.sha256_file(f) for f in c.glob("*.safetensors")}
    (c / "state.json").write_text(json.dumps(st))


def write(name: str, data: bytes | str):
    """A damage step that writes ``name`` (beside the run) with ``data``."""

    def make(run):
        f = run.parent / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data.encode() if isinstance(data, str) else data)

    return make


def flip_byte(name: str):
    """Flip one bit in the middle of the checkpoint's ``name`` tensor file (its recorded sha256 stays)."""

    def make(run):
        f = ck.find_checkpoint(run) / name
        b = bytearray(f.read_bytes())
        b[len(b) // 2] ^= 0x10
        f.write_bytes(bytes(b))

    return make


def peer(config: str, weights: bytes | None):
    """A peer (MDLM/Duo layout) folder ``peer/`` with this config.json and model.safetensors."""

    def make(run):
        d = run.parent / "peer"
        d.mkdir()
        (d / "config.json").write_text(config)
        if weights is None:
            save_file({"x": torch.zeros(2)}, str(d / "model.safetensors"))
        else:
            (d / "model.safetensors").write_bytes(weights)

    return make


def split_folder(run):
    tmp = run.parent
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "train.jsonl").write_text(
        "".join(json.dumps({"text": f"doc {i} " * 40}) + "\n" for i in range(40))
    )
    (tmp / "corpus" / "valid.jsonl").write_text(json.dumps({"text": "x"}) + "\n")


def free_port() -> int:
    """A TCP port nothing listens on now (the serve rows get past the port check)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fifo_or_dir(run, name: str, fifo: bool):
    """Make ``name`` (beside the run) a named pipe or a folder."""
    f = run.parent / name
    if fifo:
        os.mkfifo(f)
    else:
        f.mkdir()


LABELLED = "{tmp}/labelled.jsonl"


def labelled(run):
    text = "def f{i}(x):\n    return x + {i}  # the value plus one\n" * 8
    lines = [json.dumps({"text": text.format(i=i), "label": "yes" if i % 2 else "no"}) for i in range(16)]
    write("labelled.jsonl", "\n".join(lines) + "\n")(run)


def checkpoints_loop(run):
    """D20: RUN/checkpoints replaced by a symlink to itself (a loop: it cannot be read)."""
    shutil.rmtree(run / "checkpoints")
    os.symlink("checkpoints", run / "checkpoints")


CASES = [
    # (command, message fragment, how to damage a copy of the trained run first)
    (NEW + ["train.log_every=0"], "train.log_every: must be >= 1", None),
    (NEW + ["train.device=tpu"], "train.device", None),
    (NEW + ["train.device=cuda"] if not torch.cuda.is_available() else NEW + ["train.device=tpu"], "device", None),
    (NEW + ["train.num_threads=-1"], "train.num_threads: must be >= 0", None),
    (NEW + ["optim.lr_backbone=inf"], "optim.lr_backbone: must be a finite number", None),
    (NEW + ["optim.grad_clip=nan"], "optim.grad_clip: must be a finite number", None),
    (NEW + ["train.max_nonfinite_steps=0"], "train.max_nonfinite_steps", None),
    (NEW + ["data.source={tmp}/corpus"], "the valid split", split_folder),
    # corpus files: strict UTF-8 (file, line, byte), and no folder or pipe where a file is expected
    (
        NEW + ["data.source={tmp}/latin1.jsonl"],
        "latin1.jsonl:2 is not UTF-8 text (byte 28: 0xe9): corpus files must be UTF-8; convert the file",
        write("latin1.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n'),
    ),
    (
        NEW + ["data.source={tmp}/latin1.txt"],
        "latin1.txt:2 is not UTF-8 text (byte 12: 0xff)",
        write("latin1.txt", b"hello\nworld \xff\n"),
    ),
    (
        NEW + ["data.source={tmp}/corpus"],
        "valid.jsonl is a folder, not a corpus file",
        lambda run: (
            split_folder(run),
            (run.parent / "corpus" / "valid.jsonl").unlink(),
            fifo_or_dir(run, "corpus/valid.jsonl", False),
        ),
    ),
    (
        NEW + ["data.source={tmp}/fifo"],
        "is a pipe, not a corpus file or folder",
        lambda run: fifo_or_dir(run, "fifo", True),
    ),
    (["train", "--preset", "debug", "--no-progress", "--out", "{run}"], "already holds a run", None),
    (
        ["train", "--preset", "debug", "--no-progress", "--out", "{tmp}/afile"],
        "is a file",
        lambda run: (run.parent / "afile").write_text("x"),
    ),
    (["train", "--preset", "debug", "--no-progress", "--out", "/proc/replaid-run"], "cannot write to run folder", None),
    (["train", "--out", "{run}", "--resume", "--overwrite"], "pass one of them", None),
    (
        ["train", "--out", "{run}", "--resume", "train.steps=4"],
        "holds a JSON list, not a JSON object",
        corrupt_state_list,
    ),
    (
        ["train", "--out", "{run}", "--resume", "train.steps=4"],
        'state.json: field "config" is missing',
        corrupt_state_keys,
    ),
    (
        ["train", "--out", "{run}", "--resume", "train.steps=4"],
        "optimizer.json does not match the sha256",
        corrupt_optimizer,
    ),
    (["train", "--out", "{run}", "--resume"], "config.json is not JSON", corrupt_config),
    (["eval", "{run}"], "tokenizer_spec.json is not JSON", corrupt_tokenizer_spec),
    (["eval", "{run}"], "non-finite weights", nan_weights),
    (["eval", "{run}", "--t-samples", "0"], "argument --t-samples: 0: must be >= 1", None),
    (["eval", "{run}", "--max-batches", "-1"], "argument --max-batches: -1: must be >= 0", None),
    (["sample", "{run}", "--batch-size", "0"], "argument --batch-size: 0: must be >= 1", None),
    (["sample", "{run}", "--length", "100000000"], "beyond the run's trained length", None),
    (["sample", "{run}", "--num", "-1"], "argument --num: -1: must be >= 1", None),
    (["sample", "{run}", "--num", "0"], "argument --num: 0: must be >= 1", None),
    (["sample", "{run}", "--steps", "0"], "argument --steps: 0: must be >= 1", None),
    (["sample", "{run}", "--temperature", "-0.5"], "argument --temperature: -0.5: must be 0 or >= 1e-06", None),
    (["sample", "{run}", "--prompt", "return the value " * 40], "leaving nothing to generate", None),
]

# issue 28: the hostile-user report's inputs, one row each (docs/robustness.md lists them)
FSCK = "does not match the sha256 recorded"
SAMPLES = "{tmp}/s.jsonl"
HOSTILE = [
    # numbers: exact whole numbers, finite, in range (argparse types of replaid.commands)
    (["sample", "{run}", "--num", "1e9"], "'1e9' is not a whole number", None),
    (["sample", "{run}", "--steps", "1000000000"], "argument --steps: 1000000000: must be <= 100000", None),
    (["sample", "{run}", "--seed", "99999999999999999999999"], "argument --seed", None),
    (["likelihood", "{run}", "--fd-step", "nan", "--out", "{tmp}/lk"], "--fd-step: nan: must be a finite", None),
    (["likelihood", "{run}", "--rtol", "-1", "--out", "{tmp}/lk"], "argument --rtol: -1: must be >= 1e-12", None),
    (["likelihood", "{run}", "--K", "0", "--out", "{tmp}/lk"], "argument --K: 0: must be >= 1", None),
    (["memory", "--vocab", "-5"], "argument --vocab: -5: must be >= 2", None),
    (["memory", "--per-device-batch", "0"], "argument --per-device-batch: 0", None),
    (["serve", "{run}", "--threads", "-4"], "argument --threads: -4: must be >= 0", None),
    (["serve", "{run}", "--max-length", "-1"], "argument --max-length: -1: must be >= 0", None),
    (["serve", "{run}", "--port", "70000"], "argument --port: 70000: must be <= 65535", None),
    (
        ["serve", "{run}", "--max-length", "100000", "--port", str(free_port())],
        "--max-length 100000 is beyond the trained length of run",
        None,
    ),
    (["scaling", "plan", "--budgets", "1e400"], "argument --budgets: 1e400: must be a finite number", None),
    (["scaling", "plan", "--mfu", "0"], "argument --mfu: 0: must be >= 0.001", None),
    (["scaling", "run", "{tmp}/sw", "--max-parallel", "-3"], "argument --max-parallel: -3: must be >= 1", None),
    (["scaling", "run", "{tmp}/sw", "--max-parallel", "0"], "argument --max-parallel: 0: must be >= 1", None),
    (["scaling", "fit", "{tmp}/f.csv", "--bootstrap", "0"], "argument --bootstrap: 0", None),
    (["grid", "report", "{tmp}/g", "--confidence", "1.5"], "argument --confidence: 1.5: must be < 1", None),
    (["quality", SAMPLES, "--batch-size", "0"], "argument --batch-size: 0: must be >= 1", None),
    (["sweep", "{run}", "--context", "-5", "--out", "{tmp}/sw"], "argument --context: -5: must be >= 1", None),
    (["sweep", "{run}", "--steps", "0", "--out", "{tmp}/sw"], "argument --steps: 0: must be >= 1", None),
    (["zeroshot", "{run}", "--max-rows", "-1"], "argument --max-rows: -1: must be >= 0", None),
    (["zeroshot", "{run}", "--t-samples", "0"], "argument --t-samples: 0: must be >= 1", None),
    (["diagnose", "{run}", "--out", "{tmp}/d", "--grid", "1"], "argument --grid: 1: must be >= 2", None),
    (["geometry", "{run}", "--out", "{tmp}/g", "--knn", "0"], "argument --knn: 0: must be >= 1", None),
    (["data", "--vocab-size", "x"], "'x' is not a whole number", None),
    (
        NEW + ["train.steps=99999999999999999999999999"],
        "train.steps = 99999999999999999999999999 is out of range",
        None,
    ),
    (NEW + ["train.steps=1e3.5"], "train.steps expects a whole number", None),
    (NEW + ["optim.lr_backbone=1e999"], "optim.lr_backbone", None),
    (["sample", "{run}", "--context", "return the value", "--infill", "1:9999"], "--infill 1:9999 makes samples", None),
    # issue 38, numbers validated where they enter: huge finite and tiny positive values (tests/test_numbers.py)
    (
        ["sample", "{run}", "--require", "the", "--guidance-scale", "1e308"],
        "--guidance-scale: 1e+308: must be <=",
        None,
    ),
    (["sample", "{run}", "--require", "the", "--guidance-scale", "1e30"], "--guidance-scale: 1e+30: must be <=", None),
    (["sample", "{run}", "--temperature", "1e-300"], "--temperature: 1e-300: must be 0 or >= 1e-06", None),  # X10
    (["sample", "{run}", "--temperature", "1e300"], "--temperature: 1e+300: must be <= 1e+06", None),  # X11
    (["sweep", "{run}", "--out", "{tmp}/sw", "--temperatures", "1e-300"], "--temperatures: 1e-300: must be >=", None),
    (NEW + ["optim.lr_backbone=1e300"], "optim.lr_backbone: must be in [0, 10]", None),  # O24
    (
        NEW + ["train.steps=2", "model.readout_mult=1e300"],
        "model.readout_mult: 1e+300 is beyond the range float32",  # O26's input: refused before any step
        None,
    ),
    (NEW + ["model.dropout=1e-300"], "model.dropout: 1e-300 is beyond the range float32", None),
    (["likelihood", "{run}", "--out", "{tmp}/lk", "--rtol", "1e-300", "--atol", "1e-300"], "must be >= 1e-12", None),
    (["scaling", "plan", "--sizes", "tiny", "--budgets", "1"], "below one training step of every size", None),  # K06
    (["scaling", "plan", "--out", "{tmp}/k", "--budgets", "1e11", "1e11"], "1e+11 is given twice", None),  # K07
    (["scaling", "plan", "--budgets", "1e11", "1.0001e11"], "same budget to 3 significant digits", None),  # K07
    (
        ["quality", SAMPLES],
        'line 2: field "vocab_size" is 50257, but line 1 has 512',  # U10
        write(
            "s.jsonl",
            '{"text": "a", "ids": [1], "vocab_size": 512}\n{"text": "b", "ids": [3], "vocab_size": 50257}\n',
        ),
    ),
    # memory before allocation
    (["sample", "{run}", "--num", "1000000000", "--batch-size", "1000000000"], "GB free; use --num", None),
    (["sample", "{run}", "--length", "100000000", "--allow-longer"], "GB free; use --length", None),
    (
        ["likelihood", "{run}", "--K", "100000", "--batch-size", "100000000", "--out", "{tmp}/lk"],
        "GB free; use --batch-size",
        None,
    ),
    (["likelihood", "{run}", "--K", "1000000000", "--out", "{tmp}/lk"], "not even one row fits", None),
    # input files: schema checks naming the file, the line and the field
    (["quality", SAMPLES], 'line 1: field "text" is missing', write("s.jsonl", '{"words": "a b"}\n')),
    (["quality", SAMPLES], "line 1: a JSON list, not an object", write("s.jsonl", '["a", "b"]\n')),
    (["quality", SAMPLES], 'line 2: field "text" is not a string', write("s.jsonl", '{"text": "a"}\n{"text": 5}\n')),
    (
        ["quality", SAMPLES],
        'field "ids" must be a list of token ids',
        write("s.jsonl", '{"text": "a", "ids": "abc"}\n'),
    ),
    (["quality", SAMPLES], 'field "ids" must be a list', write("s.jsonl", '{"text": "a", "ids": [1, -3]}\n')),
    (
        ["quality", SAMPLES],
        'line 2: field "ids" holds 512 at position 1, beyond the vocabulary (field "vocab_size" 512',
        write(
            "s.jsonl",
            '{"text": "a", "ids": [1], "vocab_size": 512}\n{"text": "b", "ids": [3, 512], "vocab_size": 512}\n',
        ),
    ),
    (
        ["quality", SAMPLES],
        'line 1: field "vocab_size" must be a whole number >= 1',
        write("s.jsonl", '{"text": "a", "ids": [1], "vocab_size": "big"}\n'),
    ),
    (["quality", SAMPLES], "line 2: not JSON (Unterminated string", write("s.jsonl", '{"text": "a"}\n{"text": "b\n')),
    (["quality", SAMPLES], "is not UTF-8 text (byte 10)", write("s.jsonl", b'{"text": "\xff\xfe"}\n')),
    (["quality", "{tmp}"], "is not a regular file", None),
    (["quality", "{tmp}/absent.jsonl"], "absent.jsonl does not exist", None),
    (
        ["convert", "mdlm", "{tmp}/peer", "--out", "{tmp}/c"],
        "not a readable safetensors",
        peer("{}", b"not safetensors"),
    ),
    (["convert", "duo", "{tmp}/peer", "--out", "{tmp}/c"], "holds a list, not a config", peer("[1, 2]", None)),
    (["convert", "mdlm", "{tmp}/peer", "--out", "{tmp}/c"], "not readable JSON", peer("{oops", None)),
    (["convert", "mdlm", "{tmp}/peer", "--out", "{tmp}/c"], "is not a complete mdlm checkpoint", peer("{}", None)),
    (
        ["scaling", "fit", "{tmp}/f.csv"],
        "loss is nan (not finite)",
        write("f.csv", "method,flops,params,loss\nar,1e15,1e6,nan\n"),
    ),
    (["scaling", "fit", "{tmp}/f.csv"], "is not UTF-8 text", write("f.csv", b"method,flops\xff\n")),
    # paths: a file given for a run, --out among an input's files or in a foreign folder
    (["eval", "{run}/config.json"], "is a file, not a run or checkpoint folder", None),
    (["diagnose", "{run}", "--out", "{run}"], "would write among the files of the input", None),
    (["likelihood", "{run}", "--out", "{run}/checkpoints"], "would write among the files of the input", None),
    (["zeroshot", "{run}", "--out", "{run}"], "would write among the files of the input", None),
    (["sweep", "{run}", "--out", "{tmp}/afile"], "is a file, not a folder", write("afile", "x")),
    (
        NEW[:-1] + ["{tmp}/foreign"],
        "non-empty folder that holds no run (notes.txt)",
        write("foreign/notes.txt", "mine"),
    ),
    (
        ["scaling", "plan", "--sizes", "tiny", "--out", "{tmp}/foreign"],
        "holds no sweep",
        write("foreign/notes.txt", "x"),
    ),
    (["train", "--out", "{run}", "--resume", "train.steps=1"], "is at step 2, beyond train.steps=1", None),
    # issue 38: outputs never over existing ones nor inside a run's managed folders (tests/test_trust.py)
    (
        ["classifier", "train", "{run}", "--data", LABELLED, "--out", "{tmp}/clf", "--steps", "2"],
        "already holds classifier.safetensors",  # H13
        lambda run: (labelled(run), write("clf/classifier.safetensors", "mine")(run)),
    ),
    (
        [
            "classifier",
            "train",
            "{run}",
            "--data",
            LABELLED,
            "--out",
            "{tmp}/other/checkpoints/step_0000002",
            "--steps",
            "2",
        ],
        "inside the checkpoints/ of the run",  # H14: any run's, not only the input's
        lambda run: (labelled(run), shutil.copytree(run, run.parent / "other")),
    ),
    (["train", "--out", "{run}", "--resume"], "checkpoints cannot be read", checkpoints_loop),  # D20
    # integrity: a flipped bit in any tensor file is named on load
    (["eval", "{run}"], FSCK, flip_byte("ema.safetensors")),
    (["eval", "{run}", "--no-ema"], FSCK, flip_byte("model.safetensors")),
    (["train", "--out", "{run}", "--resume", "train.steps=4"], FSCK, flip_byte("optimizer.safetensors")),
    (["train", "--out", "{run}", "--resume", "train.steps=4"], FSCK, flip_byte("rng.safetensors")),
]
CASES += HOSTILE


class Marker:
    """Pickles as ``open(path, 'w')``: unpickling it would create ``path`` (weights-only loading refuses it)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def embedding_pt(name: str, obj):
    """``name`` (beside the run): ``obj`` saved with torch.save; a callable gets the folder first."""

    def make(run):
        torch.save(obj(run.parent) if callable(obj) else obj, run.parent / name)

    return make


def pickled_marker(run):
    embedding_pt("x.pt", {"a": Marker(run.parent / "UNPICKLED")})(run)


def nan_embedding(run):
    """x.safetensors: the trained run's own (V, d_e) matrix with one NaN."""
    w = load_file(str(ck.find_checkpoint(run) / "model.safetensors"))["embedding.weight"].clone()
    w[0, 0] = math.nan
    save_file({"embedding": w}, str(run.parent / "x.safetensors"))


EMB = NEW + ["model.embeddings=file"]
ACCEPTED = "accepted are .safetensors (key 'embedding'), .npy or a .pt holding one tensor"
# issue 36 §4.3: model.embeddings=file reads a (V, d_e) matrix and nothing else, in one line
EMBEDDINGS = [
    (EMB + ["model.embeddings_path={tmp}/x.pt"], f"x.pt is not a (V, d_e) matrix: {ACCEPTED}", pickled_marker),
    (
        EMB + ["model.embeddings_path={tmp}/x.pt"],
        f"x.pt is not a (V, d_e) matrix: {ACCEPTED}",
        embedding_pt("x.pt", {"embedding": torch.zeros(3, 4)}),  # weights-only loads it: a dict, not a tensor
    ),
    (
        EMB + ["model.embeddings_path={tmp}/x.pt"],
        f"x.pt is not a (V, d_e) matrix: {ACCEPTED}",
        embedding_pt("x.pt", {1, 2, 3}),  # a set: weights-only refuses it
    ),
    (
        EMB + ["model.embeddings_path={tmp}/x.npy"],
        f"x.npy is not a (V, d_e) matrix: {ACCEPTED}",
        write("x.npy", b"\x93NUMPY garbage"),
    ),
    (
        EMB + ["model.embeddings_path={tmp}/x.safetensors"],
        f"x.safetensors is not a (V, d_e) matrix: {ACCEPTED}",
        write("x.safetensors", b"not safetensors at all"),
    ),
    (
        EMB + ["model.embeddings_path={tmp}/x.pt"],
        "x.pt has shape (3, 4), expected (",
        embedding_pt("x.pt", torch.zeros(3, 4)),
    ),
    (EMB + ["model.embeddings_path={tmp}/x.safetensors"], "x.safetensors is not a (V, d_e) matrix", nan_embedding),
    (EMB + ["model.embeddings_path={tmp}/none.pt"], "none.pt does not exist", None),
    (EMB, "model.embeddings_path: is required when model.embeddings=file", None),
    (
        NEW + ["model.embeddings_path={tmp}/x.pt"],
        "model.embeddings_path: is read only with model.embeddings=file (here learned)",
        embedding_pt("x.pt", torch.zeros(3, 4)),
    ),
]
CASES += EMBEDDINGS


def foreign_tokenizer(run):
    """TS1: another run's tokenizer of the same vocabulary size (a BPE of other text) in the run's tokenizer/."""
    from replaid.data.sources import iter_documents
    from replaid.data.tokenizers import EOT, HFTokenizer, save_tokenizer, train_bpe

    vocab = json.loads((run / "tokenizer" / "tokenizer_spec.json").read_text())["vocab_size"]
    shutil.rmtree(run / "tokenizer")
    tok = train_bpe(iter_documents("stdlib", "valid"), vocab)
    save_tokenizer(HFTokenizer(tok, name="bpe-foreign", kind="bpe", eos_token=EOT), run / "tokenizer")


def data_state(state: dict):
    """Q06: the checkpoint's data_state replaced by ``state``."""

    def make(run):
        f = ck.find_checkpoint(run) / "state.json"
        st = json.loads(f.read_text())
        st["data_state"] = state
        f.write_text(json.dumps(st))

    return make


NOT_OURS = "is not the tokenizer checkpoint"
# issue 38 class 2: a run is bound to its tokenizer and its data (tests/test_binding.py has the corpus cases)
BINDING = [
    (["sample", "{run}", "--num", "1"], "has no tokenizer", lambda run: shutil.rmtree(run / "tokenizer")),  # D26
    (["eval", "{run}"], "has no tokenizer", lambda run: shutil.rmtree(run / "tokenizer")),
    (
        ["train", "--out", "{run}", "--resume", "train.steps=4"],
        "has no tokenizer",
        lambda r: shutil.rmtree(r / "tokenizer"),
    ),
    (["sample", "{run}", "--num", "1"], NOT_OURS, foreign_tokenizer),  # TS1
    (["eval", "{run}"], NOT_OURS, foreign_tokenizer),
    (["train", "--out", "{run}", "--resume", "train.steps=4"], NOT_OURS, foreign_tokenizer),
    (
        ["train", "--out", "{run}", "--resume", "train.steps=4"],
        "data_state",
        data_state({"epoch": -5, "index": 10**12}),
    ),
    (["train", "--out", "{run}", "--resume", "train.steps=4"], "data_state", data_state({"epoch": 0, "index": 10**9})),
    (["train", "--out", "{run}", "--resume", "train.steps=4"], "data_state", data_state({"epoch": 10**6, "index": 0})),
    (["train", "--out", "{run}", "--resume", "train.steps=4"], "data_state", data_state({"epoch": "0", "index": 1})),
    (["train", "--out", "{run}", "--accept-changed-data"], "modifies --resume", None),  # C7's flag alone
]
CASES += BINDING


def edit_json(where, edit):
    """A damage step: ``edit`` applied to the JSON file ``where(run)``."""

    def make(run):
        f = where(run)
        d = json.loads(f.read_text())
        edit(d)
        f.write_text(json.dumps(d))

    return make


SPEC = lambda run: run / "tokenizer" / "tokenizer_spec.json"
STATE = lambda run: ck.find_checkpoint(run) / "state.json"
# issue 38 class 1: every run-folder file is read through its schema (tests/test_schemas.py generates the rest)
SCHEMAS = [
    (
        ["sample", "{run}", "--num", "1"],
        'tokenizer_spec.json: field "name" is missing',
        edit_json(SPEC, lambda d: d.pop("name")),
    ),  # D10
    (
        ["export", "{run}", "--out", "{tmp}/x"],
        'field "name" is missing',
        edit_json(SPEC, lambda d: d.pop("name")),
    ),  # D22
    (
        ["sample", "{run}", "--num", "1"],
        'field "file" is a whole number',
        edit_json(SPEC, lambda d: d.update(file=5)),
    ),  # D11
    (
        ["sample", "{run}", "--num", "1"],
        'field "method_state" is a whole number',
        edit_json(STATE, lambda d: d.update(method_state=5)),
    ),  # D30
    (
        ["diagnose", "{run}", "--out", "{tmp}/d"],
        'field "method_state"',
        edit_json(STATE, lambda d: d.update(method_state=5)),
    ),  # DG1
    (
        ["eval", "{run}"],
        'state.json: field "step" is a JSON list',
        edit_json(STATE, lambda d: d.update(step=[4])),
    ),
    (
        ["sample", "{run}", "--num", "1"],
        'state.json: field "step" is a JSON list',
        edit_json(STATE, lambda d: d.update(step=[4])),
    ),  # D34
    (
        ["eval", "{run}/checkpoints/step_0000002"],
        'step_0000002/state.json: field "step" is a JSON list',
        edit_json(STATE, lambda d: d.update(step=[4])),
    ),  # WN6: eval on the checkpoint folder itself
    (
        ["edit", "{run}", "--text", "the value", "--steps", "2"],
        'tokenizer_spec.json: field "file" is a whole number',
        edit_json(SPEC, lambda d: d.update(file=5)),
    ),  # WN5
    (
        ["edit", "{run}", "--text", "the value", "--steps", "2"],
        'state.json: field "method_state" is a whole number',
        edit_json(STATE, lambda d: d.update(method_state=5)),
    ),  # WN4
    (["eval", "{run}"], 'field "sha256" is missing', edit_json(STATE, lambda d: d.pop("sha256"))),
    (
        ["distill", "{run}", "--out", "{tmp}/st", "--resume"],
        'distill.json: field "config" is a whole number',  # DR2
        write("st/distill.json", '{"config": 5, "teacher": "x"}'),
    ),
    (
        ["grid", "plan", "{tmp}/g.yaml", "--out", "{tmp}/g"],
        "g.yaml: 'reference' is one cell name",  # R01
        write("g.yaml", "base: debug\ncells: {a: []}\nreference: [a]\n"),
    ),
]
LANGFLOW_CONFIG = (Path(__file__).parent / "fixtures" / "peers" / "langflow" / "config.json").read_text()
CONVERT_LF = ["convert", "langflow", "{tmp}/peer", "--out", "{tmp}/c"]
SCHEMAS += [
    (CONVERT_LF, "is not a complete LangFlow checkpoint", peer('{"model_type": "bert"}', None)),  # N04
    (CONVERT_LF, "holds a list, not a config", peer("[1]", None)),  # N05
    (CONVERT_LF, "model.safetensors is not a readable safetensors", peer(LANGFLOW_CONFIG, b"x" * 20)),  # N06
    (CONVERT_LF, "is not a complete LangFlow checkpoint", peer(LANGFLOW_CONFIG, None)),  # N07
]
CASES += SCHEMAS


def files(root: Path) -> dict:
    """Every file under ``root`` with its bytes, lock files included (a refusal changes nothing)."""
    if not root.exists():
        return {}
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_case(trained: Path, tmp_path: Path, argv: list[str], damage) -> tuple[int, list[str], bool]:
    """Run one case in process on a copy of ``trained``: (exit status, stderr lines, files unchanged)."""
    import contextlib
    import io

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    if damage is not None:
        damage(run)
    before = files(tmp_path)
    argv = [
        a.replace("{run}", str(run)).replace("{tmp}", str(tmp_path)).replace("{new}", str(tmp_path / "new"))
        for a in argv
    ]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own exits (--help)
            code = e.code if isinstance(e.code, int) else 1
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    return code, lines, files(tmp_path) == before


@pytest.mark.parametrize("argv,needle,damage", CASES, ids=[" ".join(c[0][-2:])[:40] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(trained, tmp_path, argv, needle, damage):
    code, err, unchanged = run_case(trained, tmp_path, argv, damage)
    errors = [ln for ln in err if ln.startswith("replaid: error: ")]  # besides progress bars (tokenizing)
    assert code == 2 and errors == err[-1:] and needle in errors[0] and "Traceback" not in "".join(err), err
    assert unchanged  # nothing written, nothing damaged (lock files included), no new --out left behind


# V02, V03: `replaid serve` loads its runs at start-up, through the same schemas; a damaged run is refused
# there in one line, before anything listens (uvicorn.run is replaced: a run that got past the check would
# otherwise start serving and the test would hang)
SERVE = [
    ('tokenizer_spec.json: field "name" is missing', edit_json(SPEC, lambda d: d.pop("name"))),  # V02
    ('state.json: field "method_state" is a whole number', edit_json(STATE, lambda d: d.update(method_state=5))),  # V03
]


@pytest.mark.parametrize("needle,damage", SERVE, ids=["V02", "V03"])
def test_serve_refuses_a_damaged_run_at_start_up(trained, tmp_path, monkeypatch, needle, damage):
    uvicorn = pytest.importorskip("uvicorn")

    def listen(*a, **k):
        raise AssertionError("replaid serve started serving a damaged run")

    monkeypatch.setattr(uvicorn, "run", listen)
    argv = ["serve", "{run}", "--port", str(free_port()), "--device", "cpu"]
    code, err, unchanged = run_case(trained, tmp_path, argv, damage)
    assert code == 2 and len(err) == 1 and err[0].startswith("replaid: error: "), err
    assert needle in err[0] and str(tmp_path / "run") in err[0], err
    assert unchanged


def test_a_pickled_embedding_file_is_never_unpickled(trained, tmp_path):
    """Issue 36 §4.3: the refusal reads no object: the pickle's ``open`` call never runs."""
    code, err, unchanged = run_case(trained, tmp_path, EMBEDDINGS[0][0], pickled_marker)
    assert code == 2 and len(err) == 1 and not (tmp_path / "UNPICKLED").exists() and unchanged, err
    assert "weights_only" not in err[0]  # no invitation to load it in full


def test_damaged_cache_meta_names_the_file(trained, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    shutil.copytree(os.environ["REPLAID_CACHE_DIR"], cache)
    monkeypatch.setenv("REPLAID_CACHE_DIR", str(cache))
    for meta in cache.glob("valid-*.json"):
        meta.write_text("{garbage")
    assert main(["eval", str(trained)]) == 2
    err = capsys.readouterr().err.strip()
    assert "token cache meta" in err and "valid-" in err and "delete it" in err


def test_debug_flag_and_environment_show_the_traceback(tmp_path, monkeypatch):
    from replaid.config import ConfigError

    with pytest.raises(ConfigError, match="train.log_every"):
        main(["--debug", "train", "--preset", "debug", "--out", str(tmp_path / "x"), "train.log_every=0"])
    monkeypatch.setenv("REPLAID_DEBUG", "1")
    with pytest.raises(ConfigError, match="train.log_every"):
        main(["train", "--preset", "debug", "--out", str(tmp_path / "x"), "train.log_every=0"])


# ---------------------------------------------------------------- generated: every numeric option

FUZZ_SECONDS = float(os.environ.get("REPLAID_FUZZ_SECONDS", "60"))  # random extra cases stop after this
BIG = "9" * 30
# no numeric option takes these: whole numbers are digits, and every float option's range ends below 1e30
# (the float32 limit, with the headroom a computation needs: issue 38, X09-X11)
ALWAYS_BAD = ["", "abc", "nan", "inf", "-inf", "1e400", "-1e400", "1e30", "1e300", "-1e300"]
INT_BAD = ["1e9", "2.5", "0x10"]  # not whole numbers written as digits
TINY = "1e-300"  # a float option takes it only where its range starts at a closed 0 (tiny is its 0)
MAYBE_BAD = ["-1", "0", BIG, "-" + BIG, TINY]  # bad where the option's range says so
NON_FINITE = ["nan", "NaN", "+nan", "-nan", "inf", "+inf", "-inf", "Infinity", "-INFINITY", "1e999", "-2e308"]


def numeric_options():
    """(command words, option, its argparse action) for every option of every (sub)command whose type is
    a number, read from the CLI's own parser."""
    import argparse

    from replaid.cli import _parser

    def walk(p, path):
        yield path, p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    yield from walk(sp, [*path, name])

    for path, p in walk(_parser(), []):
        positionals = [a for a in p._actions if not a.option_strings and a.nargs != argparse.PARSER]
        for a in p._actions:
            if a.option_strings and getattr(a.type, "__name__", "") in ("int", "float"):
                yield path, ["{run}"] * sum(1 for x in positionals if x.required or x.nargs == "+"), a


def edge_values(a) -> list[str]:
    """The edge values every numeric option gets: ALWAYS_BAD (huge finite 1e30 and 1e300 among them), INT_BAD
    for whole numbers, MAYBE_BAD (tiny positive 1e-300 among them)."""
    return ALWAYS_BAD + (INT_BAD if a.type.__name__ == "int" else []) + MAYBE_BAD


def random_value(rng) -> str:
    """A random number-like string: a non-finite spelling, or sign + mantissa + exponent + junk."""
    if rng.random() < 0.25:
        return rng.choice(NON_FINITE)
    mant = rng.choice(["0", "1", "7", ".5", "5.", "1.5", "0.0", "1_000", "12345678901234567890", "1,5", ""])
    exp = rng.choice(["", "", "e0", "e-3", "e9", "e308", "e309", "e-400", "E5", "e"])
    return rng.choice(["", "-", "+"]) + mant + exp + rng.choice(["", "", " ", "x", "%"])


def check_bad_number(run: Path, path, pos, a, v) -> str | None:
    """Gives option ``a`` of command ``path`` the value ``v`` through ``replaid.cli.main``; returns
    None if the option's type takes ``v`` (nothing run), else asserts exit 2, exactly one line
    'replaid: error: argument OPTION: ...' and no traceback, and returns the command words."""
    import argparse
    import contextlib
    import io

    try:
        a.type(v)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        pass
    else:
        return None
    opt = a.option_strings[0]
    argv = [*path, *(x.replace("{run}", str(run)) for x in pos), f"{opt}={v}"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    where = f"{' '.join(argv[: len(path)])} {opt}={v!r}: {lines}"
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"replaid: error: argument {opt}"), where
    assert "Traceback" not in lines[0], where
    return " ".join(path)


def test_generated_bad_numbers_for_every_numeric_option(trained, tmp_path, monkeypatch):
    """Every numeric option of every command, given every edge value (not a number, empty, NaN, inf,
    1e400, '1e9' and '2.5' for whole numbers, and -1 / 0 / 30-digit numbers where its range excludes
    them): exit 2, exactly one line 'replaid: error: argument OPTION: ...', no traceback, files untouched.
    Every numeric option declares its range (int_in/float_in/POSITIVE/..., never a bare int or float).
    The edge cases always all run (no time budget); REPLAID_FUZZ_SECONDS (60) only bounds the random
    extra values after them (a taken one must be finite). Cases run in process through ``main`` with the
    parser built once (building it is most of a case's cost); the counts are printed."""
    import math
    import random
    import time

    from replaid import cli

    opts = list(numeric_options())
    bare = [f"{' '.join(p)} {a.option_strings[0]}" for p, _, a in opts if a.type in (int, float)]
    assert not bare, f"numeric options without a declared range (use int_in/float_in): {bare}"
    floats = [(p, a) for p, _, a in opts if a.type.__name__ == "float"]
    unbounded = [f"{' '.join(p)} {a.option_strings[0]}" for p, a in floats if not a.type.range[1] < 1e30]
    assert not unbounded, f"float options without a finite upper end below 1e30 (float32): {unbounded}"
    parser = cli._parser()
    monkeypatch.setattr(cli, "_parser", lambda: parser)  # main(argv) as it is, without rebuilding it per case
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = files(tmp_path)
    t0, ran, in_range, unvalidated, seen = time.time(), 0, 0, [], set()
    edges = [(path, pos, a, v) for path, pos, a in opts for v in edge_values(a)]
    for path, pos, a, v in edges:  # every option x every edge value, always
        cmd = check_bad_number(run, path, pos, a, v)
        if cmd is not None:
            ran += 1
            seen.add(cmd)
        elif v == TINY and a.type.__name__ == "float" and a.type.range[:1] + a.type.range[2:3] != (0, False):
            unvalidated.append(f"{' '.join(path)} {a.option_strings[0]} {v!r} (a positive range needs a floor)")
        elif v in MAYBE_BAD:  # within the option's declared range
            in_range += 1
        else:  # the option's type takes a non-number, a non-finite or (whole numbers) a non-digit value
            unvalidated.append(f"{' '.join(path)} {a.option_strings[0]} {v!r}")
    edge_seconds = time.time() - t0
    rng, extra, t1 = random.Random(0), 0, time.time()
    while time.time() - t1 < FUZZ_SECONDS and extra < 10 * len(edges):  # random extras, within the budget
        path, pos, a = rng.choice(opts)
        v = random_value(rng)
        extra += 1
        if check_bad_number(run, path, pos, a, v) is None:
            x = a.type(v)
            if not (math.isfinite(x) and (a.type.__name__ != "int" or isinstance(x, int))):
                unvalidated.append(f"{' '.join(path)} {a.option_strings[0]} {v!r} -> {x!r}")
    assert files(tmp_path) == before  # nothing written or damaged by any case
    print(
        f"\nfuzz: {len(edges)} edge cases over {len(opts)} numeric options in {edge_seconds:.1f}s: {ran} refused "
        f"over {len(seen)} commands, 0 tracebacks, {in_range} within an option's declared range; "
        f"{extra} random extras in {time.time() - t1:.1f}s"
    )
    assert not unvalidated, f"numeric options that take a non-number or non-finite value: {unvalidated}"
    assert ran > 0 and len(seen) == len({" ".join(p) for p, _, _ in opts})


# ---------------------------------------------------------------- generated: every numeric config override

OVERRIDE_BAD = ["nan", "inf", "-inf", "1e400", "1e300", "-1e300", "abc", ""]  # no numeric key takes these
OVERRIDE_BAD_FLOAT = ["1e-300"]  # below float32's range (a float key takes 0, or a magnitude >= 1e-30)
OVERRIDE_BAD_INT = ["2.5"]  # not a whole number


def numeric_overrides() -> list[tuple[str, str, type]]:
    """(method, key, type) for every int or float key of every method's config (its own sections too)."""
    from replaid.config import RunConfig
    from replaid.registry import method_names

    def leaves(d: dict, path: tuple = ()):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from leaves(v, path + (k,))
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                yield ".".join(path + (k,)), type(v)

    out: dict[str, tuple[str, str, type]] = {}
    for m in method_names():
        for key, typ in leaves(RunConfig(method=m).to_dict()):
            out.setdefault(key, (m, key, typ))
    return list(out.values())


def test_generated_bad_values_for_every_numeric_override():
    """Issue 38 class 3, overrides: every numeric key of every method's config (``KEY=VALUE`` on the
    command line, or a YAML --config), given NaN, inf, 1e400, 1e300, -1e300, a non-number, an empty
    string, 1e-300 (floats) or 2.5 (whole numbers), is refused by validation with a ConfigError naming
    the key (the CLI prints it as one line, exit 2: the rows above); none is accepted, none raises
    anything else. Prints the count."""
    from replaid.config import ConfigError, RunConfig, set_key

    keys, cases, wrong = numeric_overrides(), 0, []
    assert len(keys) > 40  # train, optim, model, diffusion, data, eval and the methods' own sections
    for method, key, typ in keys:
        for v in OVERRIDE_BAD + (OVERRIDE_BAD_FLOAT if typ is float else OVERRIDE_BAD_INT):
            cases += 1
            cfg = RunConfig(method=method)
            try:
                set_key(cfg, key, v)
                cfg.validate()
            except ConfigError as e:  # a joint check (beta1 and beta2, curriculum_start <= _end) names both
                if key.rsplit(".", 1)[-1] not in str(e):
                    wrong.append(f"{key}={v!r}: the message does not name it: {e}")
            except Exception as e:
                wrong.append(f"{key}={v!r}: {type(e).__name__}: {e}")
            else:
                wrong.append(f"{key}={v!r}: accepted")
    print(f"\noverrides: {cases} (key, value) cases over {len(keys)} numeric config keys, all refused")
    assert not wrong, wrong
