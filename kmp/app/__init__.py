"""The application around the library: the `kmp` commands and what the
example trainers and `kmp bench` share.

    cli              runs a parsed command (the dispatch)
    _commands        info, demo, audit, train, bench
    _doctor_command  doctor
    protocol         what an example declares, so the commands run it
                     without knowing it
    run              one run of an example: `Run`, what its `train`
                     uses around its data, model and fit (seed, strategy,
                     backup, callbacks, the results record and its one
                     writer), and `train_example`, `kmp train`'s engine
    startup          before `train`: processes and compile cache (once),
                     CPU sizes, `--batch_size=max` handed the example
    feeding          how an example's splits reach fit on this backend:
                     on the device, tf.data or arrays, in full batches
    batching         a split's batches: their count, validation's steps
                     and its padded full batches
    scale_out        where the replicas are: tf.distribute strategies,
                     keras.distribution meshes and the config's layout,
                     JAX processes, and each process's share of the data
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

The examples (`examples/`, installed as `kmp.examples`) belong here too.
Each is a keras-io tutorial whose kmp lines are the ones a user copies:
`kmp.enable(...)` before the model is built, `kmp.pin_float32` and
`kmp.wrap` where it is compiled, `model.fit` with the run's callbacks.
The surface they use is declared: `run.Run` (`start`, `scope`,
`distribute`, `data`, `callbacks`, `finish`) and `run.main` for the
script, and for their data `feeding`, `data` and `device_data` (at most
6 names in all, at most 150 lines of code each:
`tests/app/protocol_test.py`). The commands reach them only through
`protocol` (by name, never an import of an example) and hand the module
on (`batch_search`, `run.train_example`). The
application uses the library through its public API (`import kmp`); no
module of the core or of a wing imports it.
"""
