"""The shapes of a matmul layer that float8 cares about: an attention's
projections, a kernel's contracting and output sizes, and whether they
suit float8 tensor cores (multiples of 16). Read by the conversion, the
layers, the audit and the doctor.
"""

import keras


def projections(attention):
    """The four `EinsumDense` projections of a built attention layer."""
    return [
        getattr(attention, name)
        for name in (
            "_query_dense",
            "_key_dense",
            "_value_dense",
            "_output_dense",
        )
        if isinstance(getattr(attention, name, None), keras.layers.EinsumDense)
    ]


def matmul_sizes(layer):
    """`(contracting, output)` sizes of a built Dense or EinsumDense
    kernel: the product of the kernel dims it sums over, and of the rest."""
    shape = tuple(layer.kernel.shape)
    if isinstance(layer, keras.layers.EinsumDense):
        inputs, rest = layer.equation.split(",")
        kernel, output = rest.split("->")
        summed = [
            size
            for letter, size in zip(kernel, shape)
            if letter in inputs and letter not in output
        ]
    else:
        summed = shape[:1]
    contracting = 1
    for size in summed:
        contracting *= size
    total = 1
    for size in shape:
        total *= size
    return contracting, total // contracting


def is_eligible_einsum(layer):
    """Whether a built projection's sizes suit float8 tensor cores
    (multiples of 16)."""
    return all(size % 16 == 0 for size in matmul_sizes(layer))
