"""Request the Linux permission to use AMX tiles for this process (installed by kvpool).

vLLM's CPU attention picks its AMX kernel when the CPU advertises AMX, but nothing asks the
kernel for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM), so on such CPUs the first
forward pass dies with SIGILL. A .pth line imports this module at interpreter start-up, in
the API server and in every engine process it starts. On CPUs or kernels without AMX the
call fails harmlessly.
"""

import contextlib
import ctypes
import platform
import sys

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

if sys.platform == "linux" and platform.machine() == "x86_64":
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).syscall(
            SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
        )
