"""The processes of a sandboxed run, outside the program, with the standard library only
(no site, no asyncrl): ``python -I -S launcher.py --serve FD`` is the caller's fork
server, kept for its life, which forks the launcher of each run; so a run pays one
interpreter start, the program's.

The server reads requests on its socket (FD): a message of the launcher's arguments, NUL
separated, carrying four descriptors (the program's stdin, stdout and stderr, and the
run's control socket). It forks the launcher with them and sends on the control socket a
``launcher PID`` line that carries a pidfd of it (the caller's way to kill it outright, with no
process id to lose). It leaves when the caller's end closes.

Three processes for each run, each with one job:

- the launcher (outside): reads the program from its stdin, unshares the namespaces
  (mount, network, PID, IPC, UTS; and a user namespace when not root), forks the
  namespace's init, then waits for it, for the caller to close its end of the control
  socket (a kill, or the caller gone), or for the deadline: whichever comes first. It kills
  init itself, its own child, so no process id is ever guessed.
- init (PID 1 inside): builds the new root (a small read-only tmpfs with the interpreter's
  directories bound read-only, four device nodes, a fresh /proc, and a writable tmpfs at
  /tmp), pivots into it, forks the program and reaps until the program ends. When init
  ends, the kernel kills every process left in the namespace: the program's children,
  however they detached, go with it.
- the program: its own session, limits set (address space, processes, file size, open
  files, no core), an unprivileged uid of its own (root) or the user namespace's only uid,
  no new privileges, then ``python -I -S`` on its source.

Wire (the control socket, one line each, the server's, init's or the launcher's):
``launcher PID`` (with its pidfd), ``exit N``,
``signal N``, ``time`` (the launcher's deadline killed it), ``error TEXT`` (the sandbox
could not be built; nothing ran).

Argument order: control fd, source length, timeout s, memory bytes, processes, file bytes,
uid (-1: a user namespace), 1 to add the launcher's process id to that uid (a uid of
the run's own) or 0, python, then the paths to bind read-only.
"""

import _signal as signal  # the C module: signal.py's enums cost a start several ms
import ctypes
import os
import resource  # before the new root, which may not hold the standard library
import select
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

# Neither has a glibc wrapper everywhere; the numbers are the same on x86-64 and arm64
# for mount_setattr (a new call, one table), not for pivot_root.
SYS_MOUNT_SETATTR = 442
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 1
MOUNT_ATTR_NOSUID = 2
MOUNT_ATTR_NODEV = 4

INSIDE_UID = 1000  # the user namespace's one uid, when not root
ROOT = "/tmp"  # where the new root is assembled, inside the private mount namespace
PROGRAM = "/main.py"
WORKDIR = "/tmp"
DEVICES = ("null", "zero", "random", "urandom")

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")


def mount(source, target, fstype, flags, data=None):
    check(
        libc.mount(
            source and source.encode(),
            target.encode(),
            fstype and fstype.encode(),
            ctypes.c_ulong(flags),
            data and data.encode(),
        ),
        f"mount {fstype or source} on {target}",
    )


def say(fd, line):
    # The caller may be gone: what it would have read then no longer matters. (No
    # contextlib here: each import is paid at every run's start.)
    try:  # noqa: SIM105
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
    except OSError:
        pass


def main(argv):
    control = int(argv[0])
    source_length = int(argv[1])
    timeout_s = float(argv[2])
    limits = [int(value) for value in argv[3:7]]  # memory, processes, file bytes, uid
    if limits[3] >= 0 and argv[7] == "1":
        # Its process id is unique while it lives, and it outlives the run: no other run
        # shares the uid, so none shares its count of processes.
        limits[3] += os.getpid()
    python, binds = argv[8], argv[9:]
    try:
        source = read_exactly(0, source_length)
        if limits[3] < 0:
            enter_user_namespace()
        else:
            check(
                libc.unshare(
                    CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
                ),
                "unshare (mount, network, PID, IPC, UTS)",
            )
    except SetupError as error:
        say(control, f"error {error}")
        return 1
    lifeline, keep = os.pipe()  # init sees this end close when the launcher dies
    init = os.fork()
    if init == 0:
        os.close(keep)
        code = 1
        try:
            code = init_main(control, lifeline, source, limits, python, binds)
        except SetupError as error:
            say(control, f"error {error}")
        except BaseException as error:  # the caller must hear why, not see a silent end
            say(control, f"error init: {type(error).__name__}: {error}")
        os._exit(code)
    os.close(lifeline)
    return supervise(control, init, timeout_s)


def read_exactly(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise SetupError("the program's source ended early")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def enter_user_namespace():
    uid, gid = os.geteuid(), os.getegid()
    check(
        libc.unshare(
            CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        ),
        "unshare (user, mount, network, PID, IPC, UTS)",
    )
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{INSIDE_UID} {uid} 1"),
        ("gid_map", f"{INSIDE_UID} {gid} 1"),
    ):
        try:
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
        except OSError as error:
            raise SetupError(f"writing /proc/self/{name}: {error.strerror}") from None


def supervise(control, init, timeout_s):
    """Wait for init; kill it at the deadline or when the caller closes its end."""
    done = os.pidfd_open(init)
    poller = select.poll()
    poller.register(done, select.POLLIN)
    poller.register(control, select.POLLIN)
    deadline_ms = int(timeout_s * 1000)
    remaining = deadline_ms
    started = time.monotonic()
    while True:
        events = dict(poller.poll(max(remaining, 0)))
        if done in events:
            break
        if control in events:
            try:  # noqa: SIM105
                os.read(control, 1)  # only ever an end: the caller asks for a kill, or died
            except OSError:
                pass
            os.kill(init, signal.SIGKILL)
            break
        remaining = deadline_ms - int((time.monotonic() - started) * 1000)
        if remaining <= 0:
            os.kill(init, signal.SIGKILL)
            say(control, "time")
            break
    # init ends only once every process of its namespace has: this wait is the guarantee
    # that nothing of the run outlives the launcher.
    os.waitpid(init, 0)
    return 0


def init_main(control, lifeline, source, limits, python, binds):
    # A namespace's init gets from inside only the signals it handles: in a user namespace
    # the program shares its uid, and Python's own SIGINT handler would let it end init.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if select.select([lifeline], [], [], 0)[0]:  # the launcher died before the prctl
        return 1
    memory, processes, file_bytes, uid = limits
    os.umask(0)  # the modes below are meant as written, whatever the caller's umask
    build_root(source, binds, file_bytes, INSIDE_UID if uid < 0 else uid)
    program = os.fork()
    if program == 0:
        try:
            run_program(control, python, memory, processes, file_bytes, uid)
        except SetupError as error:
            say(control, f"error {error}")
        except BaseException as error:
            say(control, f"error program: {type(error).__name__}: {error}")
        os._exit(127)
    while True:  # init reaps every orphan of the namespace until the program ends
        pid, status = os.waitpid(-1, 0)
        if pid == program:
            break
    if os.WIFSIGNALED(status):
        say(control, f"signal {os.WTERMSIG(status)}")
    else:
        say(control, f"exit {os.WEXITSTATUS(status)}")
    return 0


def build_root(source, binds, file_bytes, owner):
    """The program's whole file system: read-only but for /tmp, nothing of the host's but
    the interpreter's directories and four devices."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    # The sources are opened before the new root covers /tmp, wherever they are.
    sources = {}
    for path in binds:
        try:
            sources[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as error:
            raise SetupError(f"opening {path} to bind it: {error.strerror}") from None
    root_size = len(source) + (64 << 10)
    mount("tmpfs", ROOT, "tmpfs", MS_NOSUID | MS_NODEV, f"size={root_size},nr_inodes=256,mode=755")
    for path, fd in sources.items():
        target = ROOT + path
        if os.path.islink(path):
            make_parents(target)
            os.symlink(os.readlink(path), target)
            os.close(fd)
            continue
        make_parents(target)
        if os.path.isdir(path):
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o444))
        mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        os.close(fd)
    for name in ("dev", "proc", "tmp"):
        os.mkdir(f"{ROOT}/{name}", 0o755)
    for name in DEVICES:
        os.close(os.open(f"{ROOT}/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("shm", WORKDIR),  # POSIX semaphores and shared memory (multiprocessing's)
    ):
        os.symlink(target, f"{ROOT}/dev/{name}")
    fd = os.open(ROOT + PROGRAM, os.O_CREAT | os.O_WRONLY, 0o444)
    os.write(fd, source)
    os.close(fd)
    make_read_only(ROOT, sources)
    for name in DEVICES:  # after: they keep their device access, read-only or not
        mount(f"/dev/{name}", f"{ROOT}/dev/{name}", None, MS_BIND)
    # A container's masked /proc refuses this to a user namespace: no /proc then.
    try:  # noqa: SIM105
        mount("proc", f"{ROOT}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except SetupError:
        pass
    mount(
        "tmpfs",
        ROOT + WORKDIR,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={max(file_bytes, 4096)},nr_inodes=1024,mode=700,uid={owner},gid={owner}",
    )
    enter_root(ROOT)


def make_parents(target):
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        os.makedirs(parent, 0o755)


class MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("set", "clear", "propagation", "userns")]


def make_read_only(root, binds):
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    result = libc.syscall(
        SYS_MOUNT_SETATTR,
        -100,
        root.encode(),
        AT_RECURSIVE,
        ctypes.byref(attr),
        ctypes.sizeof(attr),
    )
    if result == 0:
        return
    # Before Linux 5.12: each mount on its own (their own submounts stay as they were).
    for path in binds:
        if not os.path.islink(path):
            mount(None, root + path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter_root(root):
    os.chdir(root)
    if SYS_PIVOT_ROOT is not None and libc.syscall(SYS_PIVOT_ROOT, b".", b".") == 0:
        # The old root is stacked under the new one at "/": detach it, and with it every
        # host mount, from this namespace.
        check(libc.umount2(b".", MNT_DETACH), "detaching the old root")
    else:
        mount(root, "/", None, MS_MOVE)
        os.chroot(".")
    os.chdir("/")


def run_program(control, python, memory, processes, file_bytes, uid):
    os.setsid()  # its own group: a kill of "its group" reaches nothing outside
    os.umask(0o022)
    os.chdir(WORKDIR)
    for sig in (
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGPIPE,
        signal.SIGXFSZ,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGCHLD,
    ):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    if uid < 0:
        processes += 2  # the launcher and init share the namespace's count
    for name, value in (
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_NOFILE, 256),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(name, (value, value))
    if uid >= 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    os.set_inheritable(control, False)  # closed by the exec; still there if it fails
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": WORKDIR,
        "TMPDIR": WORKDIR,
        "LANG": "C.UTF-8",
        # glibc reserves 64 MiB of address space per malloc arena, one per thread up to
        # 8 per core: under RLIMIT_AS a few threads would exhaust the limit unused.
        "MALLOC_ARENA_MAX": "2",
    }
    try:
        os.execve(python, [python, "-I", "-S", "-B", "-u", "-X", "utf8", PROGRAM], env)
    except FileNotFoundError:
        if not os.path.exists(python):
            raise
        # The file is there: what is not is its loader (ld.so), outside the bound paths.
        raise SetupError(f"cannot start {python}: its program loader is not in the root") from None


def serve(server):
    import socket

    # Its children, the launchers, are reaped by the kernel: no zombie waits for it.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    requests = socket.socket(fileno=server)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(requests, 1 << 16, 4)
        except OSError:
            return 0
        if not message:
            return 0  # the caller closed its end, or died
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        launcher = os.fork()
        if launcher == 0:
            os.close(server)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()  # out of the server's session: nothing sent to its group reaches a run
            for target, fd in enumerate(fds[:3]):
                os.dup2(fd, target)
                os.close(fd)
            argv = message.decode().split("\0")
            os._exit(main([str(fds[3]), *argv]))
        control = socket.socket(fileno=fds[3])
        try:
            # The launcher cannot end before this unless it fails at once (it waits for the
            # program's source first): then this finds no process, and says nothing.
            pidfd = os.pidfd_open(launcher)
            socket.send_fds(control, [f"launcher {launcher}\n".encode()], [pidfd])
            os.close(pidfd)
        except OSError:
            pass  # the caller's end is gone: the launcher sees it and leaves
        control.close()
        for fd in fds[:3]:
            os.close(fd)


if __name__ == "__main__":
    # No interpreter teardown: everything it had to say is written, and the caller waits
    # for this exit.
    if sys.argv[1] == "--serve":
        os._exit(serve(int(sys.argv[2])))
    os._exit(main(sys.argv[1:]))
