"""``replaid export``: write a run as a Hugging Face Hub folder (see ``replaid/hub/export.py``)."""

from __future__ import annotations

import argparse

from replaid.commands import add_command, check_out

EXAMPLE = """example: replaid export runs/demo --out exports/demo
then:    hf upload OWNER/NAME exports/demo      (the Hub's own client; or huggingface_hub.upload_folder)
         replaid eval exports/demo   |   replaid eval OWNER/NAME"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = add_command(
        sub, "export", "Export a run as a Hugging Face Hub folder (config, safetensors, tokenizer, card).", EXAMPLE
    )
    e.add_argument("run", help="run directory, checkpoint directory or Hub id")
    e.add_argument("--out", required=True, help="new folder to write (refused if it exists and is not empty)")
    e.add_argument("--raw", action="store_true", help="export the trained weights, not the EMA")
    e.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from replaid.hub.export import export_run

    check_out(args.out, protected=(args.run,), empty=True)
    out = export_run(args.run, args.out, raw=args.raw)
    print(f"exported {args.run} -> {out}")
    return 0
