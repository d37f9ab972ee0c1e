"""The JSON Schema of a matrix file (matrix_schema.matrix_json_schema), made from the same
declarations schema.check reads: a valid schema, every shipped file valid under it, and what
the checker refuses for its shape refused by it too."""

from __future__ import annotations

import re

import pytest
import yaml

from envbuilder.model import matrix as M
from envbuilder.model import schema as S
from envbuilder.model.matrix_schema import SECTIONS, matrix_json_schema

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def validator():
    schema = matrix_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def patterns(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "pattern":
                yield v
            else:
                yield from patterns(v)
    elif isinstance(node, list):
        for v in node:
            yield from patterns(v)


def test_every_pattern_is_a_regular_expression_without_python_only_groups():
    found = list(patterns(matrix_json_schema()))
    assert found
    for p in found:
        re.compile(p)
        assert "(?P<" not in p  # (ECMA-262 spells named groups otherwise: editors read these)


@pytest.mark.parametrize("path", M.matrix_files(), ids=lambda p: p.name)
def test_every_shipped_matrix_file_is_valid_under_the_json_schema(path, validator):
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, errors[:5]


@pytest.mark.parametrize(
    "doc",
    [
        {"no_such_section": {}},
        {"gpus": {"p40": {"name": "Tesla P40"}}},  # required keys missing
        {"cuda_compat": {"libcuda": "relative/path", "source": "x"}},  # not an absolute path
        {"defaults": {"unknown_key": 1}},
        {"min_compute_capability": 6.1},  # a number where text belongs
        {"torch": {"2.6.0": {"python": "3.10"}}},  # a string where a list belongs
    ],
)
def test_what_the_checker_refuses_for_its_shape_the_json_schema_refuses(doc, validator):
    with pytest.raises(S.SchemaError):
        for section, body in doc.items():
            if section not in SECTIONS:
                raise S.SchemaError(section, "unknown section")
            S.check(body, SECTIONS[section][0], section)
    assert list(validator.iter_errors(doc))


def test_json_schema_of_each_kind():
    assert S.json_schema(S.Int(1, 9)) == {"type": "integer", "minimum": 1, "maximum": 9}
    assert S.json_schema(S.Num(0, 1, above=True)) == {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
    assert S.json_schema((S.OneOf(("a", "b")), None)) == {"anyOf": [{"enum": ["a", "b"]}, {"type": "null"}]}
    assert S.json_schema({"a": str, "b?": S.ListOf(bool, min_len=1), "*": int}) == {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "array", "items": {"type": "boolean"}, "minItems": 1},
        },
        "required": ["a"],
        "additionalProperties": {"type": "integer"},
    }
    with pytest.raises(TypeError):
        S.json_schema(object())
