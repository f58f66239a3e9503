"""What the audit's test files share: a small mixed-precision MLP, and
phrases to look for in a report."""

import keras

import kmp


def phrases(report, severity=None):
    return [
        f"{f.severity}|{f.where}|{f.problem}"
        for f in report
        if severity is None or f.severity == severity
    ]


def has(report, phrase, severity=None):
    return any(phrase in p for p in phrases(report, severity))


def quiet_audit(model, **kwargs):
    return kmp.audit(model, verbose=False, **kwargs)


def small_mlp(units=16, activation="softmax", policy="mixed_float16", out=None):
    with kmp.policy_scope(policy):
        return keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(units, activation="relu"),
                keras.layers.Dense(8),
                keras.layers.Activation(activation, dtype=out),
            ]
        )


def compiled_for_audit(
    model, optimizer="wrap", loss="categorical_crossentropy"
):
    if optimizer == "wrap":
        optimizer = kmp.wrap("adam")
    model.compile(
        optimizer=optimizer, loss=loss, jit_compile=True, auto_scale_loss=False
    )
    return model
