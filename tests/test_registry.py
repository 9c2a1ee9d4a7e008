import dataclasses

import pytest

from tfdist_ext.registry import Registry, positive_int

REG = Registry("widget")


@REG.register("plain")
@dataclasses.dataclass(frozen=True)
class Plain:
    size: int = 3


@REG.register("other")
@dataclasses.dataclass(frozen=True)
class Other:
    pass


def test_name_dict_and_instance_give_instances():
    assert REG.get("plain") == Plain()
    assert REG.get({"name": "plain", "size": 5}) == Plain(size=5)
    instance = Other()
    assert REG.get(instance) is instance
    assert REG.get(None) is None
    assert REG.get(None, default="other") == Other()


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"Unknown widget 'nope'. Valid names: 'other', 'plain'"):
        REG.get("nope")


def test_dict_without_name_or_with_unknown_option():
    with pytest.raises(ValueError, match="no 'name' key"):
        REG.get({"size": 3})
    with pytest.raises(ValueError, match=r"Plain got unknown option\(s\) \['colour'\]. Allowed: \['size'\]"):
        REG.get({"name": "plain", "colour": "red"})


def test_wrong_type_and_duplicate_registration():
    with pytest.raises(TypeError, match="Argument `widget` must be a name, a dict .* received 3 of type int"):
        REG.get(3)
    with pytest.raises(ValueError, match="already registered"):
        REG.register("plain")(Other)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_positive_int_rejects(value):
    with pytest.raises(ValueError, match=f"Argument `period` must be an integer >= 1; received {value!r}"):
        positive_int("period", value)
