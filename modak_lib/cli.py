"""``modak``: the command line.

    modak plan REQUEST [--infra FILE] [--inputs FILE] [--out DIR]
    modak schema

User mistakes print one message per problem, naming the file and the field,
and exit with status 2 (never a traceback).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from . import __version__
from .errors import CatalogueError, InputError, ModakError, NoMatchingImage

EXIT_USER = 2
EXIT_INTERNAL = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="modak", description="Plan, render and deploy optimised "
                                "AI training jobs on HPC targets.")
    p.add_argument("--version", action="version", version=f"modak {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="choose a configuration; write recipes, job script, "
                          "plan.json")
    plan.add_argument("request", help="TOSCA blueprint (.yaml) or MODAK DSL document (.json)")
    plan.add_argument("--infra", help="infrastructure description (target hardware) as base")
    plan.add_argument("--inputs", help="TOSCA inputs (YAML or JSON mapping)")
    plan.add_argument("--node", help="the AITrainingJob node, when a blueprint has several")
    plan.add_argument("--out", help="directory to write into (default: print the table only)")
    plan.add_argument("--run-id", help="run id exported as MODAK_RUN_ID (default: a hash of the job script)")
    plan.add_argument("--ca-certs", action="store_true",
                      help="recipes copy ./certs into the image (pip behind a re-signing proxy)")
    plan.add_argument("--show", type=int, default=8, metavar="N",
                      help="candidates to list in the table (default 8)")
    plan.add_argument("--json", action="store_true", help="print plan.json instead of the table")

    schema = sub.add_parser("schema", help="print the JSON Schema of every MODAK input")
    schema.add_argument("--only", choices=["dsl", "infra", "tosca", "plan"],
                        help="one schema instead of all")
    return p


def _inputs(path: Optional[str]) -> dict:
    if not path:
        return {}
    from .readers.common import load_document
    data = load_document(Path(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError("TOSCA inputs must be a mapping of input names to values", path)
    return data


def cmd_plan(args: argparse.Namespace) -> int:
    from .pipeline import make_plan
    from .readers import read_request

    request = read_request(args.request, infra=args.infra, inputs=_inputs(args.inputs),
                           node=args.node)
    result = make_plan(request, run_id=args.run_id, ca_certs=args.ca_certs)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in result.files.items():
            path = out / name
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)  # atomic: a killed run leaves the old file or the new one
        (out / result.plan.job_script).chmod(0o755)
    if args.json:
        sys.stdout.write(result.files["plan.json"])
    else:
        from .report import plan_table
        sys.stdout.write(plan_table(result.plan, show=args.show,
                                    out=args.out))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from .schema import schemas
    doc = schemas(args.only)
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"plan": cmd_plan, "schema": cmd_schema}[args.command](args)
    except InputError as exc:
        for line in exc.format().splitlines():
            print(f"modak: error: {line}", file=sys.stderr)
        return EXIT_USER
    except NoMatchingImage as exc:
        print(f"modak: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except CatalogueError as exc:
        print(f"modak: internal error: {exc}", file=sys.stderr)
        return EXIT_INTERNAL
    except ModakError as exc:
        print(f"modak: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
