"""The `kmp` commands, run once the command line is parsed and checked.

`kmp_cli` (the console script's entry point, outside this package) parses
the command line without Keras, refuses bad input, sets up stderr and
imports kmp; then `run` hands the parsed arguments to the command:
`info`, `demo`, `audit`, `train`, `bench` (`kmp.app._commands`) or
`doctor` (`kmp.app._doctor_command`). The whole command in this
process, as the tests run it, is `kmp_cli.main(argv)`: the launcher
imports the application, never the other way round.
"""

from kmp.app._commands import audit
from kmp.app._commands import bench
from kmp.app._commands import demo
from kmp.app._commands import info
from kmp.app._commands import train
from kmp.app._doctor_command import doctor


def run(args) -> int:
    """Runs the parsed command (`kmp_cli.parser.parse`); returns the exit
    status: 0, or for `audit` 1 when a finding is an error."""
    if args.command == "info":
        info(as_json=args.json)
    elif args.command == "demo":
        demo(args)
    elif args.command == "audit":
        report = audit(args)
        return int(any(f.severity == "error" for f in report))
    elif args.command == "train":
        train(args)
    elif args.command == "bench":
        bench(args)
    elif args.command == "doctor":
        doctor(args)
    return 0
