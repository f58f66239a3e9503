"""The names of precisions (`kmp_config.names`): what Keras makes of
them, and that the library and the command line take the same ones."""

import dataclasses

import keras
import pytest

import kmp
from kmp_config import configs
from kmp_config import names

pytestmark = pytest.mark.backend_independent


def test_each_mixed_policy_computes_in_its_half_dtype():
    assert set(names.MIXED_POLICIES) < set(names.POLICIES)
    for half, policy in names.MIXED_POLICY.items():
        dtype_policy = keras.DTypePolicy(policy)
        assert dtype_policy.compute_dtype == half
        assert dtype_policy.variable_dtype == "float32"
    assert sorted(names.MIXED_POLICY) == sorted(names.HALF_DTYPES)


def test_the_library_and_the_flags_take_the_same_policies():
    for policy in names.POLICIES:
        previous = kmp.enable(policy)
        keras.config.set_dtype_policy(previous)
    with pytest.raises(kmp.InputError, match="'auto', 'float32'"):
        kmp.enable("float16")
    (policy,) = [
        f for f in dataclasses.fields(configs.RunConfig) if f.name == "policy"
    ]
    assert policy.metadata["choices"] == names.POLICIES
