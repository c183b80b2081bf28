"""`queue-server` on the PATH of the guides' shells: the command, forked by the CLI's fork
server (tests/helpers/cli_forks.py) instead of started afresh.

A guide's shell runs `queue-server ...` as a user's terminal does; the name on its PATH
runs this relay (`python -I -S`, no site: about 15 ms of CPU where the console script's
start and imports take 0.3 s). It hands the fork server its argv, environment, directory
and standard streams, and stands in for the command in the shell: it is the pid the
shell knows (`$!`, `kill`), it passes on the signals a shell or a terminal sends, and it
ends as the command ended: the command's exit status, or the signal that ended it. A
relay killed outright (the test's SIGKILL of the shell's group) takes its command with
it: the fork server kills a command whose relay is gone.

Started as `python -I -S cli_relay.py SOCKET BIN ARGS...`; not imported.
"""

import json
import os
import signal
import socket
import sys

PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def main() -> None:
    path, binary, *args = sys.argv[1:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(path)
    head = {"argv": [binary, *args], "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(conn, [json.dumps(head).encode()], [0, 1, 2])
    pid = int(conn.recv(64))

    def pass_on(signum: int, frame: object) -> None:
        os.kill(pid, signum)

    for signum in PASSED_ON:
        signal.signal(signum, pass_on)
    code = int(conn.recv(64))
    if code < 0:  # ended by a signal: end by the same one, as the shell expects
        if -code in PASSED_ON:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
