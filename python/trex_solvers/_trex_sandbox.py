"""In-process guard for programs run by `trex eval`: an audit hook (PEP 578) that refuses network access,
new processes (other than the solver the look-alikes start) and writes outside the working directory.

The sandbox also isolates at the OS level (network namespace, rlimits, an unprivileged uid) when it can;
this hook is the portable fallback and gives clear error messages.
"""
import os
import sys

_state = {"solver": False, "root": None, "installed": False}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class SandboxViolation(PermissionError):
    pass


def allow_solver(flag):
    _state["solver"] = bool(flag)


def _inside(path):
    try:
        if isinstance(path, int):
            return True
        p = os.fsdecode(path)
        if p in ("/dev/null", "/dev/stdout", "/dev/stderr"):
            return True
        full = os.path.realpath(os.path.abspath(p))
        root = _state["root"]
        return full == root or full.startswith(root + os.sep)
    except Exception:
        return False


def _hook(event, args):
    if event.startswith("socket."):
        if event in ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
                     "socket.gethostbyname", "socket.gethostbyaddr"):
            raise SandboxViolation("network access is disabled in the trex eval sandbox (%s)" % event)
        return
    if event == "open":
        path, mode, flags = args
        writes = False
        if mode is not None and isinstance(mode, str):
            writes = any(c in mode for c in "wax+")
        elif flags is not None:
            writes = bool(flags & _WRITE_FLAGS)
        if writes and not _inside(path):
            raise SandboxViolation("writing outside the working directory is not allowed: %r" % (path,))
        return
    if event in ("os.remove", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod",
                 "os.chown", "os.link", "os.symlink", "os.utime", "shutil.rmtree", "shutil.move",
                 "shutil.copyfile", "os.removexattr", "os.setxattr"):
        targets = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
        if event in ("os.rename", "os.replace", "os.link", "os.symlink", "shutil.move", "shutil.copyfile"):
            targets = targets[1:2] if event in ("os.symlink", "shutil.copyfile") else targets
        for t in targets:
            if not _inside(t):
                raise SandboxViolation("changing files outside the working directory is not allowed: %r" % (t,))
        return
    if event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                 "os.forkpty", "pty.spawn"):
        if not _state["solver"]:
            raise SandboxViolation("starting processes is not allowed in the trex eval sandbox (%s)" % event)
        return
    if event in ("ctypes.dlopen", "ctypes.dlsym"):
        return


def install(root):
    if _state["installed"]:
        return
    _state["root"] = os.path.realpath(root)
    _state["installed"] = True
    sys.addaudithook(_hook)
