"""``modak``: the command line.

    modak init [DIR]                  a blueprint, its script and an inventory to start from
    modak init --script FILE [DIR]    a blueprint around the user's own script in DIR
    modak plan REQUEST [--infra FILE] [--inputs FILE] [--out DIR [--new-run]] [--json]
    modak model fit|eval|predict|plot [--json]
    modak probe [--infra FILE]        measure this host's GFLOP/s and bandwidth for the model
    modak tosca-types [--json]        the installed TOSCA types' path
    modak schema [--only NAME]
    modak wheelhouse [--image ID] [PKG ...]   wheels for offline image builds
    modak opera validate|deploy|outputs|undeploy REQUEST [--infra FILE] [--inputs FILE]

``-q`` prints only the result (and errors), ``-v`` adds what MODAK did to get it (the
model it loaded or fitted, timings); ``--json`` prints the data instead of the table.

User mistakes print one message per problem, naming the file and the field,
and exit with status 2 (never a traceback).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from . import __version__
from .errors import CatalogueError, InputError, ModakError, NoMatchingImage, shorten

PINS = ".modak-requests"  # in a --out directory: its requests' pinned runs (runs.py)

EXIT_USER = 2
EXIT_INTERNAL = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="modak", description="Plan, render and deploy optimised "
                                "AI training jobs on HPC targets.")
    p.add_argument("--version", action="version", version=f"modak {__version__}")
    _loudness(p, argparse.SUPPRESS)
    p.set_defaults(verbose=0, quiet=False)
    # -v/-q also after the command (`modak plan X -q`)
    common = argparse.ArgumentParser(add_help=False)
    _loudness(common, argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser

    def add_parser(name, **kw):
        return add(name, parents=[common], **kw)
    sub.add_parser = add_parser  # type: ignore[method-assign]

    opera = sub.add_parser("opera", help="deploy a request with xOpera (its CSAR written "
                           "from the request as MODAK reads it, with the installed types and "
                           "the collection's playbooks)")
    opera.add_argument("action", choices=["validate", "deploy", "outputs", "undeploy"])
    opera.add_argument("request", help="TOSCA blueprint or MODAK DSL document")
    opera.add_argument("--infra", help="the target's hardware, as for modak plan")
    opera.add_argument("--inputs", help="TOSCA inputs (YAML or JSON mapping)")
    opera.add_argument("--new-run", action="store_true",
                       help="deploy: plan the request as a new run (MODAK_NEW_RUN=1)")
    opera.add_argument("--clean", action="store_true",
                       help="deploy: forget an earlier deployment of this file (another "
                       "request, or a new run), whose run stays on the front-end")
    opera.add_argument("--format", choices=["yaml", "json"],
                       help="outputs: opera's output format")

    init = sub.add_parser("init", help="write a starting blueprint, its training script, "
                          "the TOSCA types, an infrastructure file and an inventory")
    init.add_argument("dir", nargs="?", default=".", help="where to write (default: here)")
    init.add_argument("--script", metavar="FILE",
                      help="your own training script in DIR: write the blueprint around it "
                      "(its framework, options, packages and data read from it, never run) "
                      "instead of the example and its train.py")
    init.add_argument("--framework", choices=["pytorch", "tensorflow", "keras"],
                      help="with --script: its framework, where its imports do not tell")
    init.add_argument("--force", action="store_true", help="replace files that exist")
    init.add_argument("--json", action="store_true", help="print the written paths as JSON")

    plan = sub.add_parser("plan", help="choose a configuration; write recipes, job script, "
                          "plan.json")
    plan.add_argument("request", help="TOSCA blueprint (.yaml) or MODAK DSL document (.json)")
    plan.add_argument("--infra", help="infrastructure description (target hardware) as base")
    plan.add_argument("--inputs", help="TOSCA inputs (YAML or JSON mapping)")
    plan.add_argument("--node", help="the AITrainingJob node, when a blueprint has several")
    plan.add_argument("--out", help="directory to write into (default: print the table only)")
    plan.add_argument("--run-id", help="run id exported as MODAK_RUN_ID (default: a hash of the job script)")
    plan.add_argument("--new-run", action="store_true",
                      help="with --out: plan again under a new run id, though DIR holds this "
                      "request's plan (by default that plan is reused: one request, one run)")
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
        m = msub.add_parser(name, help=text, parents=[common])
        m.add_argument("--store", help="results store (default $MODAK_RESULTS or ~/.local/...)")
        m.add_argument("--model-file", help="model artefact (default $MODAK_MODEL or ~/.local/...)")
        m.add_argument("--data", action="append", default=[], metavar="CSV",
                       help="more measurements (a campaign's CSV, as the store exports it)")
        if name == "predict":
            m.add_argument("request")
            m.add_argument("--infra")
            m.add_argument("--inputs")
        if name == "plot":
            m.add_argument("--out", default="model.png")
        if name in ("eval", "plot"):
            m.add_argument("--estimator", help="default: the saved model's (else linear)")
        if name == "eval":
            m.add_argument("--compare", metavar="NAMES",
                           help="the estimators to compare, comma-separated (default: every "
                                "one; 'none': no comparison)")
        if name != "plot":
            m.add_argument("--json", action="store_true", help="print the data as JSON")

    probe = sub.add_parser("probe", help="measure this host's GFLOP/s (fp32, bf16) and "
                           "memory bandwidth (about 10 s) for the performance model, and "
                           "remember them for the target of --infra")
    probe.add_argument("--infra", help="the target the figures belong to (default: this host "
                       "as a local target)")
    probe.add_argument("--seconds", type=float, default=8.0, help="the probe's budget")
    probe.add_argument("--json", action="store_true", help="print the probe's record")

    wheels = sub.add_parser("wheelhouse", help="download the wheels an image installs from "
                            "on a front-end without a package index (the deploy copies them "
                            "when it builds)")
    wheels.add_argument("requirements", nargs="*", help="more to download besides what the "
                        "image of --image installs (a request's pip_packages)")
    wheels.add_argument("--image", help="the catalogue's image (variant id) to download for "
                        "(default: its first that installs from a wheelhouse, "
                        "pytorch-2.13.0-cpu)")
    wheels.add_argument("--dir", help="where (default: wheelhouse/ in MODAK's directory, "
                        "where the deploy looks)")

    types = sub.add_parser("tosca-types", help="print the path of MODAK's TOSCA types (copy "
                           "them beside a blueprint and import them by name)")
    types.add_argument("--json", action="store_true", help="path and version as JSON")
    schema = sub.add_parser("schema", help="print the JSON Schema of every MODAK input")
    schema.add_argument("--only", choices=["dsl", "infra", "tosca", "plan"],
                        help="one schema instead of all")
    return p


def _loudness(parser: argparse.ArgumentParser, default) -> None:
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="count", default=default,
                      help="say more: the model used, timings, every candidate")
    loud.add_argument("-q", "--quiet", action="store_true", default=default,
                      help="print only the result and errors")


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


def _say(args: argparse.Namespace, text: str, level: int = 1) -> None:
    """Progress for people on stderr: level 1 with -v, level 0 (what a person waits for)
    without it; never with -q."""
    if not args.quiet and args.verbose >= level:
        print(f"modak: {text}", file=sys.stderr)


def cmd_plan(args: argparse.Namespace) -> int:
    from .pipeline import make_plan
    from .readers import read_request

    from .readers.appfiles import application_files, files_digest, unsent_names, unsent_warning
    from .models import Plan

    started = time.perf_counter()
    request = read_request(args.request, infra=args.infra, inputs=_inputs(args.inputs),
                           node=args.node)
    try:
        pairs = application_files(request)
    except InputError as exc:  # planning needs no file; a deploy would stop here
        if request.application.files:
            raise
        pairs = []
        if not args.quiet:
            print(f"modak: warning: {exc}", file=sys.stderr)
    app_files = tuple(dest for _, dest in pairs)
    unsent = unsent_warning(unsent_names(request, pairs))
    if unsent and not args.quiet:
        print(f"modak: warning: {request.source}: {unsent}", file=sys.stderr)

    # with --out, the same request is one run: its plan in DIR is reused (see runs.py)
    pins = key = None
    if args.out:
        from .runs import Pins, file_digest, request_key
        pins = Pins(Path(args.out) / PINS)
        key = request_key({"request": file_digest(args.request),
                           "infra": file_digest(args.infra), "inputs": file_digest(args.inputs),
                           "node": args.node, "run_id": args.run_id,
                           "ca_certs": args.ca_certs, "files": files_digest(pairs)})
    pinned = pins.get(key) if pins is not None and not args.new_run else None
    try:
        plan = Plan.model_validate(pinned["plan"]) if pinned is not None else None
    except ValueError:  # a plan of an older MODAK: plan again
        pinned = None
    if pinned is not None:
        plan_json = json.dumps(pinned["plan"], indent=2) + "\n"
        _say(args, f"reusing the plan of run {plan.run_id} in {args.out} (--new-run plans again)")
    else:
        predictor = _predictor(args.model, args)
        result = make_plan(request, predictor=predictor, run_id=args.run_id,
                           ca_certs=args.ca_certs, app_files=app_files,
                           new_run=args.new_run and pins is not None)
        plan, plan_json = result.plan, result.files["plan.json"]
        if args.out:
            from .files import check_targets, write_atomic
            check_targets(args.out, result.files)
            for name, text in result.files.items():
                write_atomic(args.out, name, text,
                             0o755 if name == result.plan.job_script else 0o644)
            pins.put(key, {"plan_dir": str(Path(args.out).resolve()), "run_id": plan.run_id})
    _say(args, f"planned in {time.perf_counter() - started:.2f} s")
    if not args.quiet:  # what the job would lack (the deploy's default wheelhouse)
        from .imports import plan_warning
        from .wheelhouse import default_dir
        lacking = plan_warning(plan, request, pairs, default_dir())
        if lacking:
            print(f"modak: warning: {request.source}: {lacking}", file=sys.stderr)
    if args.json:
        sys.stdout.write(plan_json)
    elif args.quiet:
        print(f"{plan.chosen.label()} (decided by {plan.decided_by})")
    else:
        from .report import plan_table
        show = len(plan.candidates) if args.verbose else args.show
        sys.stdout.write(plan_table(plan, show=show, out=None if pinned else args.out))
        if pinned is not None:
            print(f"(the plan of run {plan.run_id}, pinned in {args.out}: "
                  "--new-run plans again)")
    return 0


def _predictor(choice: str, args: Optional[argparse.Namespace] = None):
    """The planner's predictor for ``--model`` (see :func:`predict.load_predictor`)."""
    from .perf.predictor import load_predictor
    return load_predictor(choice, say=(lambda text: _say(args, text)) if args else None,
                          notice=(lambda text: _say(args, text, 0)) if args else None)


def cmd_model(args: argparse.Namespace) -> int:
    from .perf import evaluate as ev, fit as pf
    from .report import table_lines
    from .results import ResultsStore, load_frame

    path = Path(args.model_file) if args.model_file else pf.default_path()
    store = ResultsStore(args.store)

    def data():
        return load_frame(store, extra=args.data)

    if args.model_command == "fit":
        from .files import ensure_dir
        ensure_dir(path.parent)  # (before a fit of a minute, not after it)
        fitted = pf.fit(data())
        fitted.save(path)
        card = fitted.card
        if args.json:
            return _print_json({"path": str(path), **card.model_dump(
                include={"model_id", "estimator", "rows", "configurations", "families",
                         "targets", "held_out_by", "held_out_mape"})})
        if args.quiet:
            print(path)
            return 0
        print(f"fitted {card.model_id} on {card.rows} measurements of {card.configurations} "
              f"configurations ({len(card.families)} workload families, {len(card.targets)} "
              f"targets); saved {path}")
        rows = [[k, "-" if v is None else f"{v:.1%}", "kept" if k == card.estimator else ""]
                for k, v in card.held_out_mape.items()]
        print("\n".join(table_lines(rows, ["estimator", f"MAPE ({card.held_out_by} held out)",
                                           ""])))
        return 0
    if args.model_command in ("eval", "plot"):
        if not args.estimator:
            args.estimator = pf.load(path, say=lambda t: _say(args, t),
                                     store_path=args.store).name \
                if path.exists() else "linear"
        compare = args.model_command == "eval" and (
            True if not getattr(args, "compare", None) else
            [n for n in args.compare.split(",") if n and n != "none"])
        result = ev.evaluate(data(), args.estimator, compare=compare)
        if args.model_command == "plot":
            print(f"wrote {ev.plot(result, Path(args.out))}")
            return 0
        if args.json:  # the per-configuration frame as rows, NaN as null (valid JSON)
            rows = [{k: pf._plain(v) for k, v in row.items()}
                    for row in result["configurations"].to_dict("records")]
            return _print_json({**result, "configurations": rows})
        for line in eval_lines(result, table_lines):
            print(line)
        return 0
    # predict
    from .pipeline import make_plan
    from .readers import read_request
    request = read_request(args.request, infra=args.infra, inputs=_inputs(args.inputs))
    predictor = pf.model_predictor(pf.load(path, say=lambda t: _say(args, t),
                                           store_path=args.store), data())
    plan = make_plan(request, predictor=predictor).plan
    if args.json:
        return _print_json({"candidates": [
            {"rank": c.rank, "configuration": c.configuration.model_dump(mode="json"),
             "prediction": c.prediction.model_dump(mode="json") if c.prediction else None}
            for c in plan.candidates], "notes": list(plan.notes)})
    rows = [[str(c.rank), c.configuration.label(),
             f"{c.prediction.seconds:.4g}" if c.prediction else "-",
             f"[{c.prediction.low:.3g}, {c.prediction.high:.3g}]" if c.prediction else "",
             c.prediction.source if c.prediction else ""] for c in plan.candidates]
    print("\n".join(table_lines(rows, ["#", "configuration", "s/step", "90% interval",
                                       "source"])))
    for note in plan.notes:
        print(f"note: {note}")
    return 0


def eval_lines(result: dict, table_lines) -> list[str]:
    """``modak model eval`` as tables: per workload family, per target, overall."""
    from .perf.fit import LOCO_FOLDS
    from .perf.search import MIN_GAIN

    def pct(v: float) -> str:
        return "-" if v != v else f"{v:.1%}"

    def times(v: float) -> str:
        return "-" if v != v else f"{v:.2f}x"

    out = [f"estimator {result['estimator']}, {result['rows']} measurements; MAPE on medians "
           "of repeats with a configuration (LOCO: configurations dealt into "
           f"{LOCO_FOLDS} folds), a workload family (LOWO) or a target "
           "(LOTO) held out of the fit; regret of the held-out model's choice against the "
           "best measured configuration; its worst speed-up over stock", ""]
    out[0] += ("; '+stock': the held-out model told the cell's one stock run (its ratios "
               "to stock on that time)")
    head = ["configs", "LOCO MAPE", "LOWO MAPE", "LOWO +stock", "LOTO MAPE", "LOTO +stock",
            "LOWO regret", "LOTO regret", "LOWO worst vs stock"]
    for by, title in (("workload", "family"), ("target", "target")):
        key = "per_family" if by == "workload" else "per_target"
        rows = [[r[by], str(r["configurations"]), pct(r["mape_loco"]), pct(r["mape_lowo"]),
                 pct(r.get("mape_lowo_stock", float("nan"))), pct(r["mape_loto"]),
                 pct(r.get("mape_loto_stock", float("nan"))), pct(r["regret_lowo"]),
                 pct(r["regret_loto"]), times(r["worst_vs_stock_lowo"])] for r in result[key]]
        out += table_lines(rows, [title] + head) + [""]
    rows = [[how.upper(), pct(o["mape"]), pct(o.get("mape_after_stock", float("nan"))),
             pct(o.get("mape_level_given", float("nan"))),
             pct(o["median_regret"]), pct(o.get("median_regret_fp32", float("nan"))),
             times(o["worst_vs_stock"]),
             pct(o.get("median_regret_search", float("nan"))),
             times(o.get("worst_vs_stock_search", float("nan"))), str(o["decisions"])]
            for how, o in result["overall"].items()]
    out += table_lines(rows, ["held out", "MAPE", "MAPE +stock", "MAPE level given",
                              "median regret", "regret fp32", "worst vs stock",
                              "regret +search", "worst +search", "decisions"])
    out.append("'level given': each held-out cell's predictions scaled by its mean error "
               "(what is left: the knobs' effects relative to one another, and the medians' "
               "scatter); the choice is the planner's (stock unless a candidate is predicted "
               f"{100 * MIN_GAIN:g}% faster; no bf16 where one keeping fp32 is predicted: no "
               "run shows that it keeps the loss); 'regret fp32': against the best measured "
               "configuration keeping fp32 (those the model alone may choose); '+search': the "
               "held-out model's top candidates and stock settled by the budgeted search, each "
               "trial one recorded run")
    rep = result.get("repeatability")
    if rep:
        out.append(f"repeatability: {pct(rep['mape'])} MAPE of one run against the median of "
                   f"its configuration's other runs ({rep['configurations']} configurations "
                   "measured twice or more, stock left out): the scatter the measured medians "
                   "carry")
    sc = result.get("round_scatter")
    if sc and sc["configurations"]:
        out.append(f"round to round: a configuration's time ratio to stock scatters by "
                   f"{sc['scatter']:.3f} in log time (standard deviation, median over the "
                   f"{sc['configurations']} configurations measured beside stock in two or "
                   "more rounds): what a budgeted search's round can tell from noise "
                   "(search.TRIAL_SCATTER on the shipped data)")
    by_target: dict[str, list[str]] = {}
    for m in result.get("machines") or []:
        by_target.setdefault(m["target"], []).append(
            f"{m['factor']:.2f}x" if m["factor"] is not None else "-")
    if by_target:
        out.append("machines of one target (their runs' time against its median machine, "
                   "beyond what their probes say; '-': no run shared with another): "
                   + "; ".join(f"{t}: {', '.join(v)}" for t, v in by_target.items()))
    rep = result.get("reproducibility")
    if rep and rep["configurations"]:
        out.append(f"reproducibility across machines: {pct(rep['mape'])} MAPE of a "
                   "configuration's time on like machines (the same CPU, cores and GPU; "
                   f"{rep['configurations']} configurations on {rep['targets']} targets), each "
                   "machine's speed taken out by the other families' runs, against its best "
                   "single value: what the target's description does not carry")
    if result.get("estimators"):
        out.append("")
        rows = [[name, *(pct(v.get(how, float("nan"))) for how in ("loco", "lowo", "loto"))]
                for name, v in result["estimators"].items()]
        out += table_lines(rows, ["estimator", f"LOCO MAPE ({LOCO_FOLDS} folds)",
                                  "LOWO MAPE", "LOTO MAPE"])
    return out


def cmd_probe(args: argparse.Namespace) -> int:
    """Measure this host and remember the figures for the target of ``--infra``."""
    from .models import Target
    from .perf.probe import remember, run_here
    from .readers import read_infra
    from .readers.infra import resolve_host_values

    target = read_infra(args.infra) if args.infra else Target(**resolve_host_values(
        {"name": "local", "microarchitecture": "host", "cores_per_node": "host"}))
    rec = run_here(seconds=max(1.0, min(60.0, args.seconds)))
    path = remember(target, rec)
    if args.json:
        return _print_json({**rec, "cache": str(path), "target": target.name})
    if not args.quiet:
        op = f", {rec['op_us']} us an operation" if rec.get("op_us") else ""
        where = rec.get("accelerator") or f"{rec['threads']} threads"
        print(f"{target.name}: fp32 {rec['gflops_fp32']} GFLOP/s, bf16 "
              f"{rec['gflops_bf16'] or '-'} GFLOP/s, memory {rec['bandwidth_gbs']} GB/s{op} "
              f"({where}, {rec['library']}, {rec['seconds']} s); remembered in {path}")
    return 0


def cmd_wheelhouse(args: argparse.Namespace) -> int:
    """Fill the wheelhouse (``modak_lib.wheelhouse``)."""
    from .wheelhouse import default_dir, fill, variant

    image = variant(args.image)
    directory = Path(args.dir) if args.dir else default_dir()
    reqs = list(image.pip) + [r for r in args.requirements if r not in image.pip]
    rc = fill(directory, reqs, image.arch)
    if rc:
        print(f"modak: error: pip could not download {' '.join(reqs)} into {directory} "
              f"(exit status {rc}; see its messages above)", file=sys.stderr)
        return EXIT_USER
    if not args.quiet:
        wheels = sorted(directory.glob("*.whl"))
        size = sum(w.stat().st_size for w in wheels) / 2**20
        print(f"wheelhouse {directory}: {len(wheels)} wheels, {size:.0f} MiB")
    return 0


def _print_json(data) -> int:
    json.dump(data, sys.stdout, indent=2, default=_plain)
    sys.stdout.write("\n")
    return 0


def _plain(value):
    """numpy scalars and other non-JSON values of the model's results."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def cmd_schema(args: argparse.Namespace) -> int:
    from .schema import schemas
    doc = schemas(args.only)
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def cmd_tosca_types(args: argparse.Namespace) -> int:
    """The installed TOSCA types: a blueprint anywhere imports them after
    ``cp "$(modak tosca-types)" .`` as ``imports: [modak-types.yaml]``."""
    path = Path(__file__).parent / "data" / "tosca" / "modak-types.yaml"
    if args.json:
        return _print_json({"path": str(path), "version": __version__})
    print(path)
    return 0


def cmd_opera(args: argparse.Namespace) -> int:
    """``opera ACTION`` for a request anywhere (``modak_lib.opera``)."""
    from .opera import run

    extra = ("--format", args.format) if args.format and args.action == "outputs" else ()
    return run(args.action, Path(args.request), infra=args.infra,
               inputs=_inputs(args.inputs), new_run=args.new_run, extra=extra,
               clean=args.clean)


def cmd_init(args: argparse.Namespace) -> int:
    """A starting point in the user's own directory: the example blueprint (importing the
    TOSCA types copied beside it) and its training script, or with ``--script`` a blueprint
    around the user's own (``modak_lib.scaffold``); an infrastructure file for this machine
    and an Ansible inventory for ``ansible-playbook modak.modak.deploy``."""
    from .files import check_targets, write_atomic
    data = Path(__file__).parent / "data"
    out = Path(args.dir)
    facts = None
    if args.script:
        facts = _own_script(out, args.script, args.framework)
        from .scaffold import blueprint as scaffold
        files = {"blueprint.yaml": scaffold(facts)}
    elif args.framework:
        raise ModakError("--framework: only with --script (the example's script is PyTorch's)")
    else:
        blueprint = (data / "examples" / "blueprint.yaml").read_text(encoding="utf-8")
        # the checkout's example imports the types from the repository; here they lie
        # beside it
        blueprint = blueprint.replace("../../tosca/modak-types.yaml", "modak-types.yaml")
        files = {"blueprint.yaml": blueprint,
                 "train.py": (data / "examples" / "train.py").read_text(encoding="utf-8")}
    files.update({
        "modak-types.yaml": (data / "tosca" / "modak-types.yaml").read_text(encoding="utf-8"),
        "infra-local.yaml": (data / "examples" / "infra-local.yaml").read_text(encoding="utf-8"),
        "inventory.yml": (data / "examples" / "inventory.yml").read_text(encoding="utf-8"),
    })
    if facts is not None:
        _reads_back(files)
    present = [name for name in files if os.path.lexists(out / name)]
    if present and not args.force:
        raise ModakError(f"{out}: {', '.join(present)} exist(s); nothing was written "
                         "(--force replaces them)")
    check_targets(out, files)
    written = [str(write_atomic(out, name, text)) for name, text in files.items()]
    if args.json:
        return _print_json({"written": written})
    if not args.quiet:
        print(f"wrote {', '.join(files)} into {out}/; next:")
        if facts is not None:
            for line in _said(facts):
                print(f"  {line}")
        print(f"  modak plan {out / 'blueprint.yaml'} --infra {out / 'infra-local.yaml'}")
        print(f"  ansible-playbook modak.modak.deploy -i {out / 'inventory.yml'}")
    return 0


def _own_script(out: Path, script: str, framework: Optional[str]):
    """``modak init --script``: the user's script in ``out``, read (``scaffold``)."""
    from .readers.appfiles import through_link
    from .scaffold import read_script
    from .validate import check_relative
    from .wheelhouse import default_dir

    base = out.resolve()
    if os.path.isabs(script):
        try:
            script = str(Path(script).resolve().relative_to(base))
        except ValueError:
            raise ModakError(f"--script {script}: not inside {out} (the blueprint's directory, "
                             "whose files the run directory receives)") from None
    try:
        script = check_relative(script, "--script")
    except ValueError as exc:
        raise ModakError(str(exc)) from None
    path = base / script
    if script.startswith("../") or through_link(base, script):
        raise ModakError(f"--script {script}: a symbolic link or a path leading outside {out}")
    if not path.is_file():
        raise ModakError(f"--script {script}: no such file in {out}")
    house = default_dir()
    return read_script(base, script, framework, house if house.is_dir() else None)


def _reads_back(files: dict[str, str]) -> None:
    """The written blueprint, read by the TOSCA reader as ``modak plan`` reads it (in a
    scratch directory, before anything is written)."""
    import tempfile

    from .readers import read_request

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("blueprint.yaml", "modak-types.yaml"):
            Path(tmp, name).write_text(files[name], encoding="utf-8")
        try:
            read_request(Path(tmp, "blueprint.yaml"))
        except InputError as exc:
            raise CatalogueError(f"the blueprint written for the script does not read back: "
                                 f"{exc.format()}") from None


def _said(facts) -> list[str]:
    """What ``modak init --script`` read from the script, and what to check."""
    lines = [f"(read from {facts.script}: framework {facts.framework}"
             + (f" {facts.framework_version}" if facts.framework_version else "")
             + (f", batch {facts.batch_size}" if facts.batch_size else ", batch not read")
             + (f", {facts.length_kind} from {facts.length.flag}" if facts.length else
                ", length not read") + ")"]
    if facts.pip_packages:
        from .catalogue import load_catalogue

        lines.append(f"(pip_packages: {', '.join(facts.pip_packages)}"
                     + (f"; named as imported, check pip's names: {', '.join(facts.guessed)}"
                        if facts.guessed else "") + ")")
        try:
            offline = facts.image and load_catalogue().variant(facts.image).wheelhouse
        except KeyError:
            offline = False
        if offline:
            lines.append(f"modak wheelhouse --image {facts.image} "
                         + " ".join(facts.pip_packages)
                         + "   # a front-end without a package index installs from it")
    if facts.files:
        lines.append(f"(files: {', '.join(facts.files)})")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"plan": cmd_plan, "schema": cmd_schema, "model": cmd_model,
                "probe": cmd_probe, "tosca-types": cmd_tosca_types,
                "wheelhouse": cmd_wheelhouse, "opera": cmd_opera,
                "init": cmd_init}[args.command](args)
    except InputError as exc:
        for line in exc.format().splitlines():
            print(f"modak: error: {line}", file=sys.stderr)
        return EXIT_USER
    except NoMatchingImage as exc:
        print(f"modak: error: {shorten(exc, 1000)}", file=sys.stderr)
        return EXIT_USER
    except CatalogueError as exc:
        print(f"modak: internal error: {shorten(exc, 1000)}", file=sys.stderr)
        return EXIT_INTERNAL
    except ModakError as exc:
        print(f"modak: error: {shorten(exc, 1000)}", file=sys.stderr)
        return EXIT_USER
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
