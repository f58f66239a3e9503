"""The application around the library: the `kmp` command and what the
example trainers and `kmp bench` share.

    cli              the `kmp` command's parser and dispatch
    _commands        info, demo, audit, train, bench
    _doctor_command  doctor
    recipes          the examples' plumbing: flags as a config dataclass,
                     strategy, callbacks, the results record
    data             TFDS datasets, or synthetic twins that say so
    report           run tables (rich, Markdown), step times, memory, PNG
    bench            float32 vs mixed precision, interleaved in one process
    demo             a 30-second mixed-float16 fit (`kmp demo`)

The examples (`examples/`, installed as `kmp.examples`) belong here too:
they import `recipes` and `data`, and `cli` and `bench` import them. The
application uses the library through its public API (`import kmp`); no
module of the core or of a wing imports it.
"""
