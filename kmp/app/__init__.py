"""The application around the library: the `kmp` commands and what the
example trainers and `kmp bench` share.

    cli              runs a parsed command (the dispatch)
    _commands        info, demo, audit, train, bench
    _doctor_command  doctor
    protocol         what an example declares, so the commands run it
                     without knowing it
    session          one run of an example: the engine under its
                     `train` (processes, cache, seed, strategy, policy,
                     backup, results, save)
    feeding          how an example's splits reach fit on this backend:
                     on the device, tf.data or arrays, in full batches
    recipes          the examples' plumbing: CPU sizes, data for fit,
                     callbacks, the results record
    scale_out        where the replicas are: tf.distribute strategies,
                     keras.distribution meshes, JAX processes, and each
                     process's share of the data
    backup           the backup an interrupted run resumes from, and
                     the configuration and epochs it belongs to
    data             TFDS datasets, or synthetic twins that say so
    device_data      batches cut and augmented on the device (JAX)
    report           run tables (rich, Markdown), step times, memory, PNG
    bench            float32 vs mixed precision, interleaved in one process
    flops            a model's training FLOPs, the device's peak
    demo             a 30-second mixed-float16 fit (`kmp demo`)

The command starts in `kmp_cli`, the launcher, outside this package:
importing anything here imports `kmp`, and with it Keras, so the command
parses and checks its arguments there first (with the examples'
settings, `kmp_config.configs`, and the stderr filter, `kmp_cli.logs`),
then imports kmp and calls `cli.run`. Nothing here imports the launcher;
the names every layer shares (configs, flags, policy names, `fail`) are
the leaf's, `kmp_config`.

The examples (`examples/`, installed as `kmp.examples`) belong here too:
they import `session`, `feeding`, `data`, `device_data` and `recipes`
(at most 6 names in all: `tests/app/protocol_test.py`); the commands reach them
only through `protocol` (by name, never an import of an example). The
application uses the library through its public API (`import kmp`); no
module of the core or of a wing imports it.
"""
