"""TOSCA blueprints: the shipped examples parse with tosca-parser; errors name node and property."""
import textwrap
import typing

import pytest
import yaml
from conftest import ROOT

from modak_lib.errors import InputError
from modak_lib.models import Application, Build, Compiler, JobOptions, Optimisation, Target
from modak_lib.readers import read_request

EXAMPLES = sorted(p for p in (ROOT / "tosca/examples").glob("*.yaml")
                  if "tosca_definitions_version" in p.read_text()) + [ROOT / "examples/mnist-cnn/blueprint.yaml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_parse_with_tosca_parser(path):
    from toscaparser.tosca_template import ToscaTemplate
    template = ToscaTemplate(str(path))
    assert any(n.type == "modak.nodes.AITrainingJob" for n in template.nodetemplates)
    req = read_request(path, infra=ROOT / "examples/infra/hlrs-testbed.yaml")
    assert req.source_format == "tosca"


def test_cpu_slurm_example():
    req = read_request(ROOT / "tosca/examples/mnist-cnn-slurm.yaml")
    assert req.target.scheduler == "slurm" and req.target.name == "cluster"
    assert req.target.frontend.port == 2222  # from an input's default
    assert req.application.arguments == ("--model", "mnist-cnn", "--steps", "300")
    assert req.optimisation.compilers == (Compiler.torch_compile,)


def test_gpu_pbs_example():
    req = read_request(ROOT / "tosca/examples/resnet50-gpu-pbs.yaml")
    assert req.target.scheduler == "pbs"
    assert req.target.accelerators.model == "V100"
    assert req.job.wall_time_limit == 30 * 3600


def test_inputs_override_defaults(tmp_path):
    inputs = tmp_path / "inputs.yaml"
    inputs.write_text("arguments: [--steps, '50']\nfrontend_port: 2200\n")
    from modak_lib.cli import _inputs
    req = read_request(ROOT / "tosca/examples/mnist-cnn-slurm.yaml", inputs=_inputs(str(inputs)))
    assert req.application.arguments[-1] == "50" and req.target.frontend.port == 2200


def test_infra_is_the_base_blueprint_properties_win():
    req = read_request(ROOT / "examples/mnist-cnn/blueprint.yaml",
                       infra=ROOT / "examples/infra/hlrs-testbed.yaml")
    assert req.target.microarchitecture == "skylake_avx512"  # the blueprint leaves it out
    assert req.target.name == "target"  # the node's name
    req = read_request(ROOT / "tosca/examples/mnist-cnn-slurm.yaml",
                       infra=ROOT / "examples/infra/hlrs-testbed.yaml")
    assert req.target.scheduler == "slurm"  # written in the blueprint
    assert req.target.frontend.user == "hpcuser" and req.target.frontend.work_dir == "modak-runs"


def blueprint(tmp_path, job_props: str, target_props: str = "scheduler: slurm",
              node_type: str = "modak.nodes.AITrainingJob", name: str = "bp.yaml"):
    text = textwrap.dedent(f"""\
        tosca_definitions_version: tosca_simple_yaml_1_3
        imports:
          - {ROOT}/tosca/modak-types.yaml
        topology_template:
          node_templates:
            hpc:
              type: modak.nodes.HPCTarget
              properties:
                {{TARGET}}
            train:
              type: {node_type}
              properties:
                {{JOB}}
              requirements:
                - host: hpc
        """)
    text = text.replace("{TARGET}", textwrap.indent(target_props, " " * 8).lstrip())
    text = text.replace("{JOB}", textwrap.indent(job_props, " " * 8).lstrip())
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD_APP = "application: {framework: pytorch, framework_version: '2.13', script: train.py}"


def errors(path):
    with pytest.raises(InputError) as exc:
        read_request(path)
    assert exc.value.source == str(path)
    return exc.value.problems


def test_minimal_blueprint_reads(tmp_path):
    req = read_request(blueprint(tmp_path, GOOD_APP))
    assert req.application.script == "train.py"
    assert read_request(blueprint(tmp_path, GOOD_APP[:-1] + ", epochs: 12}")
                        ).application.epochs == 12


@pytest.mark.parametrize("job_props, target_props, path, words", [
    (GOOD_APP + "\njob_options: {job_name: 'bad name'}", "scheduler: slurm",
     "topology_template.node_templates.train.properties.job_options.job_name", "invalid job name"),
    (GOOD_APP + "\noptimisation: {compilers: [tvm]}", "scheduler: slurm",
     "topology_template.node_templates.train.properties.optimisation.compilers[0]", "xla"),
    (GOOD_APP + "\njob_options: {wall_time_limit: 'tomorrow'}", "scheduler: slurm",
     "topology_template.node_templates.train.properties.job_options.wall_time_limit",
     "invalid wall time"),
    (GOOD_APP, "scheduler: slurm\nfrontend: {host: 'bad host;rm'}",
     "topology_template.node_templates.hpc.properties.frontend.host", "invalid host name"),
    (GOOD_APP, "scheduler: slurm\ncores_per_node: 0",
     "topology_template.node_templates.hpc.properties.cores_per_node", "greater than or equal to 1"),
    (GOOD_APP[:-1] + ", steps: 600, epochs: 3}", "scheduler: slurm",
     "topology_template.node_templates.train.properties.application",
     "steps and epochs both state the job's length"),
    (GOOD_APP[:-1] + ", epochs: 0}", "scheduler: slurm",
     "topology_template.node_templates.train.properties.application.epochs",
     "greater than or equal to 1"),
])
def test_property_errors_name_node_and_path(tmp_path, job_props, target_props, path, words):
    found = errors(blueprint(tmp_path, job_props, target_props))
    assert any(p == path and words in m for p, m in found), found


def test_unknown_type_is_reported(tmp_path):
    found = errors(blueprint(tmp_path, GOOD_APP, node_type="modak.nodes.AITrainingJbo"))
    assert found[0][1] == 'TOSCA: InvalidTypeError: Type "modak.nodes.AITrainingJbo" is not a valid type.'
    assert not any("File " in m or "line " in m for _, m in found), found  # no traceback


def test_missing_required_property(tmp_path):
    found = errors(blueprint(tmp_path, "job_options: {job_name: x}"))
    assert any("application" in m and "train" in m for _, m in found), found


def test_unknown_property_in_datatype(tmp_path):
    found = errors(blueprint(tmp_path, GOOD_APP + "\noptimisation: {colour: red}"))
    assert any("colour" in m for _, m in found), found


def test_a_field_an_older_copy_of_the_types_lacks_says_to_copy_them_anew(tmp_path):
    """A blueprint beside the ``modak-types.yaml`` an older MODAK's ``modak init`` wrote,
    using a field this MODAK added (``application.outputs``): tosca-parser's error names
    the field, and MODAK says that this one's types have it and how to copy them; a field
    no MODAK has gets no such advice."""
    import yaml
    types = yaml.safe_load((ROOT / "tosca/modak-types.yaml").read_text())
    del types["data_types"]["modak.datatypes.Application"]["properties"]["outputs"]
    (tmp_path / "modak-types.yaml").write_text(yaml.safe_dump(types))
    path = blueprint(tmp_path, GOOD_APP[:-1] + ", outputs: [checkpoints]}")
    path.write_text(path.read_text().replace(f"{ROOT}/tosca/modak-types.yaml",
                                             "modak-types.yaml"))
    (found,) = [m for _, m in errors(path) if "outputs" in m]
    assert found.endswith('contains unknown field "outputs". Refer to the definition to verify '
                          "valid values. (this MODAK's modak.datatypes.Application has it: the "
                          "blueprint imports an older MODAK's modak-types.yaml; copy this "
                          'one\'s beside it: cp "$(modak tosca-types)" DIR)'), found
    path.write_text(path.read_text().replace("outputs: [checkpoints]", "colour: red"))
    (found,) = [m for _, m in errors(path) if "colour" in m]
    assert "modak tosca-types" not in found


def test_a_misspelt_field_is_named_with_the_one_meant(tmp_path):
    """A slip of a field's name (a data type's, or a node's property) gets the field it is
    close to; a name close to none gets the type's fields where they are few."""
    path = blueprint(tmp_path, GOOD_APP[:-1] + ", batchsize: 16}")
    (found,) = [m for _, m in errors(path) if "batchsize" in m]
    assert found.endswith("(did you mean 'batch_size'?)"), found
    path = blueprint(tmp_path, GOOD_APP + "\noptimisation: {enable_autotuning: true, "
                     "autotune: true}")
    (found,) = [m for _, m in errors(path) if "autotune" in m]
    assert "(known: acc_type, allocators, allow_reduced_precision," in found, found
    assert "enable_autotuning" in found
    path.write_text(path.read_text().replace("optimisation:", "optimization:"))
    (found,) = [m for _, m in errors(path) if "optimization" in m]
    assert found.endswith("(did you mean 'optimisation'?)"), found


def test_scheduler_constraint(tmp_path):
    found = errors(blueprint(tmp_path, GOOD_APP, "scheduler: sge"))
    assert any("sge" in m for _, m in found), found


def test_yaml_syntax_error_has_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("tosca_definitions_version: tosca_simple_yaml_1_3\ntopology_template: [\n")
    found = errors(path)
    assert "invalid YAML at line" in found[0][1]


@pytest.mark.parametrize("topology", ["", "topology_template:", "topology_template: {}",
                                      "topology_template: [train]"])
def test_a_blueprint_without_a_topology_is_refused_not_a_traceback(tmp_path, topology):
    """A file of types only (MODAK's own, passed by mistake) parses as TOSCA with no topology:
    the error names the field."""
    path = tmp_path / "types-only.yaml"
    path.write_text("tosca_definitions_version: tosca_simple_yaml_1_3\n"
                    f"imports: [{ROOT / 'tosca/modak-types.yaml'}]\n{topology}\n")
    ((where, message),) = errors(path)
    assert where == "topology_template" and "modak.nodes.AITrainingJob node" in message
    assert message.startswith("must be a mapping, not list" if "[" in topology
                              else "missing or empty")


def test_missing_input_value(tmp_path):
    path = blueprint(tmp_path, "application: {framework: pytorch, script: {get_input: s}}")
    text = path.read_text().replace("topology_template:\n", "topology_template:\n  inputs:\n    s: {type: string}\n", 1)
    path.write_text(text)
    found = errors(path)
    assert any("s" in m for _, m in found), found


# ---------------------------------------------------------------------------
# the TOSCA types and MODAK's models must not drift apart
TYPES = yaml.safe_load((ROOT / "tosca/modak-types.yaml").read_text())
PAIRS = [("modak.datatypes.Build", Build), ("modak.datatypes.Application", Application), ("modak.datatypes.JobOptions", JobOptions),
         ("modak.datatypes.Optimisation", Optimisation)]


@pytest.mark.parametrize("tosca_name, model", PAIRS, ids=[p[0] for p in PAIRS])
def test_tosca_datatypes_match_models(tosca_name, model):
    tosca_props = set(TYPES["data_types"][tosca_name]["properties"])
    assert tosca_props == set(model.model_fields)
    for name, prop in TYPES["data_types"][tosca_name]["properties"].items():
        default = model.model_fields[name].default
        if "default" in prop:
            assert prop["default"] == default, name


def test_tosca_target_matches_model():
    props = set(TYPES["node_types"]["modak.nodes.HPCTarget"]["properties"])
    assert props == set(Target.model_fields) - {"name"}  # the node's name is the target's
    fields = set(TYPES["data_types"]["modak.datatypes.Frontend"]["properties"])
    frontend = typing.get_type_hints(Target)["frontend"]
    assert fields == set(frontend.model_fields)


def test_an_infrastructure_file_key_misspelt_is_named_with_the_one_meant(tmp_path):
    from modak_lib.readers.infra import read_infra
    path = tmp_path / "infra.yaml"
    path.write_text("name: c\nscheduler: pbs\npartition: [batch]\n")
    with pytest.raises(InputError) as exc:
        read_infra(path)
    assert exc.value.problems == [("partition", "unknown key (did you mean 'partitions'?)")]
