"""Typed image selection: versions as versions, CPUs by archspec, an explicit score."""
import pytest
from conftest import request

from modak_lib.catalogue import (Catalogue, load_catalogue, microarch_runs_on, select_images,
                                 version_matcher)
from modak_lib.errors import InputError, NoMatchingImage
from packaging.version import Version


@pytest.mark.parametrize("spec, version, ok", [
    ("2.1", "2.1.0", True), ("2.1", "2.1.4", True), ("2.1", "2.10.1", False),
    ("2.10", "2.1.0", False), ("2.10", "2.10.1", True), ("2.1.0", "2.1.0", True),
    ("2.1.0", "2.1.1", False), ("2", "2.21.0", True), (">=2.10,<3", "2.1.0", False),
    (">=2.10,<3", "2.21.0", True), ("~=2.10.0", "2.10.1", True), (None, "1.0", True),
])
def test_version_matcher(spec, version, ok):
    _, match = version_matcher(spec)
    assert match(Version(version)) is ok


def test_invalid_version_is_a_user_error():
    with pytest.raises(InputError):
        version_matcher(">>2")


def ids(matches):
    return [m.variant.id for m in matches]


def test_2_1_never_selects_2_10():
    req = request(framework="tensorflow", version="2.1")
    got = ids(select_images(req))
    assert got and all(i.startswith("tensorflow-2.1.0") for i in got)
    got = ids(select_images(request(framework="tensorflow", version="2.10")))
    assert got and all(i.startswith("tensorflow-2.10.1") for i in got)


def test_score_prefers_vendor_build_when_cpu_allows():
    m = select_images(request(framework="tensorflow", version="2.1"))
    assert m[0].variant.id == "tensorflow-2.1.0-cpu-intel"  # x86_64_v3 target
    assert dict(m[0].breakdown)["flavour vendor"] == 20
    old_cpu = request(framework="tensorflow", version="2.1",
                      target={"microarchitecture": "x86_64"})
    assert ids(select_images(old_cpu)) == ["tensorflow-2.1.0-cpu"]


def test_without_opt_build_source_builds_are_out():
    opt = request(target={"max_build_hours": 10})
    assert "pytorch-2.13.0-cpu-src" in ids(select_images(opt))
    assert ids(select_images(opt))[0] == "pytorch-2.13.0-cpu-src"
    plain = request(target={"max_build_hours": 10}, optimisation={"enable_opt_build": False})
    assert "pytorch-2.13.0-cpu-src" not in ids(select_images(plain))


def test_long_builds_need_the_target_to_allow_them():
    assert "pytorch-2.13.0-cpu-src" not in ids(select_images(request()))


def test_gpu_model_must_be_supported():
    req = request(framework="tensorflow", version="2.10",
                  target={"accelerators": {"vendor": "nvidia", "model": "H100"}})
    with pytest.raises(NoMatchingImage) as exc:
        select_images(req)
    msg = str(exc.value)
    assert "Nearest: tensorflow-2.10.1-gpu (no build for H100 (sm 9.0))" in msg
    req = request(framework="tensorflow", version="2.10",
                  target={"accelerators": {"vendor": "nvidia", "model": "A100"}})
    assert ids(select_images(req)) == ["tensorflow-2.10.1-gpu"]


def test_no_match_lists_nearest_variants():
    with pytest.raises(NoMatchingImage) as exc:
        select_images(request(version="3.0"))
    msg = str(exc.value)
    assert msg.startswith("no image variant for pytorch 3.0 for x86_64/x86_64_v3. Nearest: ")
    assert "pytorch-2.13.0-cpu (version 2.13.0 does not match 3.0)" in msg


@pytest.mark.parametrize("backend, image", [("tensorflow", "keras-3.15.1-cpu"),
                                            ("jax", "keras-3.15.1-cpu"),
                                            ("torch", "keras-3.15.1-torch-cpu")])
def test_a_keras_backend_picks_the_image_that_installs_it(backend, image):
    req = request(framework="keras", version="3", application={"keras_backend": backend})
    assert ids(select_images(req)) == [image]


def test_framework_without_images():
    with pytest.raises(NoMatchingImage, match="the catalogue has no cntk image"):
        select_images(request(framework="cntk", version="2.7"))


def test_arch_and_microarch():
    arm = request(target={"cpu_arch": "aarch64", "microarchitecture": "neoverse_v1"})
    assert ids(select_images(arm)) == ["pytorch-2.13.0-cpu-aarch64"]
    assert microarch_runs_on("x86_64_v3", "zen4")
    assert not microarch_runs_on("x86_64_v3", "x86_64_v2")
    assert not microarch_runs_on("skylake_avx512", "zen2")


def test_unknown_microarch_is_a_field_error():
    with pytest.raises(InputError) as exc:
        select_images(request(target={"microarchitecture": "pentium9"}))
    assert exc.value.problems[0][0] == "target.microarchitecture"


def test_catalogue_is_valid_and_ids_unique():
    cat = load_catalogue()
    assert isinstance(cat, Catalogue) and len({v.id for v in cat.variants}) == len(cat.variants)
    for v in cat.variants:
        for alloc, path in v.allocators.items():
            assert path.startswith("/usr/lib/"), (v.id, alloc)
