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
    plan.add_argument("--model", default="auto", metavar="auto|none|PATH",
                      help="performance model: auto (the saved one, fitted on first use), "
                           "none (the rule-based prior), or a model file")

    model = sub.add_parser("model", help="the performance model: fit, eval, predict, plot")
    msub = model.add_subparsers(dest="model_command", required=True)
    for name, text in (("fit", "fit on the shipped dataset and the results store, and save"),
                       ("eval", "held-out errors, decision regret, speedup over stock"),
                       ("plot", "predicted vs measured (held out) as a PNG"),
                       ("predict", "predicted seconds per step of every candidate")):
        m = msub.add_parser(name, help=text)
        m.add_argument("--store", help="results store (default $MODAK_RESULTS or ~/.local/...)")
        m.add_argument("--model-file", help="model artefact (default $MODAK_MODEL or ~/.local/...)")
        if name == "predict":
            m.add_argument("request")
            m.add_argument("--infra")
            m.add_argument("--inputs")
        if name == "plot":
            m.add_argument("--out", default="model.png")
        if name in ("eval", "plot"):
            m.add_argument("--estimator", help="default: the saved model's (else linear)")

    sub.add_parser("tosca-types", help="print the path of MODAK's TOSCA types (copy them "
                   "beside a blueprint and import them by name)")
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

    from .readers.appfiles import application_files

    request = read_request(args.request, infra=args.infra, inputs=_inputs(args.inputs),
                           node=args.node)
    try:
        app_files = tuple(dest for _, dest in application_files(request))
    except InputError as exc:  # planning needs no file; a deploy would stop here
        if request.application.files:
            raise
        app_files = ()
        print(f"modak: warning: {exc}", file=sys.stderr)
    result = make_plan(request, predictor=_predictor(args.model), run_id=args.run_id,
                       ca_certs=args.ca_certs, app_files=app_files)
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


def _predictor(choice: str):
    """The performance model the planner asks, or None for the prior.

    A linear model is evaluated from its exported formula (fast: no scikit-learn or pandas);
    other estimators load scikit-learn. ``auto`` fits a model on first use.
    """
    if choice == "none":
        return None
    from .model import default_path
    from .predict import FastPredictor, PredictError
    path = default_path() if choice == "auto" else Path(choice)
    if not path.exists():
        if choice != "auto":
            raise ModakError(f"{path}: no fitted model (run `modak model fit`)")
        try:
            import sklearn  # noqa: F401
        except ImportError:
            return None  # no model and no way to fit one: the prior decides
        from .model import fit_if_possible
        if not fit_if_possible(path):
            return None
    try:
        return FastPredictor.load(path)
    except PredictError as exc:
        if "refit" in str(exc):
            if choice != "auto":
                raise ModakError(str(exc)) from None
            # the saved model is from another MODAK (features may differ): refit it once
            from .model import fit_if_possible
            if not fit_if_possible(path):
                return None
            return FastPredictor.load(path)
    from .model import ModelPredictor, load, training_frame  # a non-linear estimator
    from .results import ResultsStore, load_frame
    return ModelPredictor(load(path), training_frame(load_frame(ResultsStore())))


def cmd_model(args: argparse.Namespace) -> int:
    from . import model as m
    from .report import table_lines
    from .results import ResultsStore, load_frame

    path = Path(args.model_file) if args.model_file else m.default_path()
    store = ResultsStore(args.store)
    if args.model_command == "fit":
        fitted = m.fit(load_frame(store))
        fitted.save(path)
        meta = fitted.meta
        print(f"fitted {meta['model_id']} on {meta['rows']} measurements of "
              f"{meta['configurations']} configurations; saved {path}")
        rows = [[k, f"{v:.1%}", "kept" if k == meta["estimator"] else ""]
                for k, v in meta["held_out_mape"].items()]
        print("\n".join(table_lines(rows, ["estimator", "held-out MAPE", ""])))
        return 0
    if args.model_command in ("eval", "plot"):
        if not args.estimator:
            args.estimator = m.load(path).name if path.exists() else "linear"
        result = m.evaluate(load_frame(store), args.estimator)
        if args.model_command == "plot":
            print(f"wrote {m.plot(result, Path(args.out))}")
            return 0
        print(f"estimator {args.estimator}: held-out MAPE per workload "
              "(LOCO: configuration left out; LOWO: whole workload left out)")
        rows = [[r["workload"], str(r["configurations"]), f"{r['mape_loco']:.1%}",
                 f"{r['mape_lowo']:.1%}"] for r in result["per_workload"]]
        print("\n".join(table_lines(rows, ["workload", "configs", "LOCO MAPE", "LOWO MAPE"])))
        print("\ndecisions (the model's LOCO choice vs the best measured configuration)")
        rows = [[d["workload"], d["framework"], d["target"], d["chosen"], d["best"],
                 f"{d['regret']:.1%}", f"{d['speedup_vs_stock']:.2f}x"]
                for d in result["decisions"]]
        print("\n".join(table_lines(rows, ["workload", "framework", "target", "chosen",
                                           "best measured", "regret", "vs stock"])))
        print("\nestimators (LOCO MAPE over all measurements)")
        rows = [[k, f"{v:.1%}"] for k, v in result["estimators"].items()]
        print("\n".join(table_lines(rows, ["estimator", "MAPE"])))
        return 0
    # predict
    from .pipeline import make_plan
    from .readers import read_request
    request = read_request(args.request, infra=args.infra, inputs=_inputs(args.inputs))
    predictor = m.ModelPredictor(m.load(path), m.training_frame(load_frame(store)))
    plan = make_plan(request, predictor=predictor).plan
    rows = [[str(c.rank), c.configuration.label(),
             f"{c.prediction.seconds:.4g}" if c.prediction else "-",
             f"[{c.prediction.low:.3g}, {c.prediction.high:.3g}]" if c.prediction else "",
             c.prediction.source if c.prediction else ""] for c in plan.candidates]
    print("\n".join(table_lines(rows, ["#", "configuration", "s/step", "90% interval",
                                       "source"])))
    for note in plan.notes:
        print(f"note: {note}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from .schema import schemas
    doc = schemas(args.only)
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def cmd_tosca_types(args: argparse.Namespace) -> int:
    """The installed TOSCA types: a blueprint anywhere imports them after
    ``cp "$(modak tosca-types)" .`` as ``imports: [modak-types.yaml]``."""
    print(Path(__file__).parent / "data" / "tosca" / "modak-types.yaml")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"plan": cmd_plan, "schema": cmd_schema, "model": cmd_model,
                "tosca-types": cmd_tosca_types}[args.command](args)
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
