"""One image-reference grammar (oci/reference.py) behind every place that takes one: the
matrix's images, export-image / import-image, apptainer --image. A reference one of them took
and another refused (an IPv6 registry, `[::1]:5000/...`) is now the same answer everywhere."""

from __future__ import annotations

import pytest

from envbuilder.engines.apptainer import image_reference
from envbuilder.errors import UserError
from envbuilder.model import schema as S
from envbuilder.engines.archive import check_reference
from envbuilder.oci.reference import match

DIGEST = "sha256:" + "ab" * 32
GOOD = [
    f"[::1]:5000/envbuild/p40@{DIGEST}",
    f"localhost:5000/envbuild/p40:latest@{DIGEST}",
    f"registry.example.org/team/envbuild/h100@{DIGEST}",
    f"nvidia/cuda:12.4.1@{DIGEST}",
]
BAD = ["Envbuild/P40", "x y", "a\nb", "$(id)/x", "-v/x", "reg:port/x", "x@sha256:abc", ""]


@pytest.mark.parametrize("ref", GOOD)
def test_every_entry_point_takes_a_good_reference(ref):
    assert match(ref)
    S.check(ref, S.IMAGE, "images.runtime")
    assert check_reference(ref) == ref
    assert image_reference(ref) == (ref, DIGEST)


@pytest.mark.parametrize("ref", BAD)
def test_every_entry_point_refuses_a_bad_one(ref):
    assert not match(ref)
    with pytest.raises(S.SchemaError):
        S.check(ref, S.IMAGE, "images.runtime")
    with pytest.raises(UserError):
        check_reference(ref)
    with pytest.raises(UserError):
        image_reference(ref)
