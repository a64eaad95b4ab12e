//! The process that ends an exec tool's whole process group when the
//! runner (the sandbox, `basecamp run`) dies without a chance to end the
//! call itself: SIGKILL, the OOM killer.
//!
//! A parent-death signal reaches one process and is not inherited by its
//! children: set on the tool, it killed the tool and left what the tool had
//! started (`sh -c 'helper & wait'`) running, reparented to init. So the
//! process forked for the tool, the leader of its new process group, does
//! not become the tool: it forks the tool and stays behind as its keeper.
//!
//! ```text
//! runner ── keeper: group leader, SIGTERM when the runner dies
//!             └── tool: SIGKILL when the keeper dies
//!                   └── what the tool starts: same group
//! ```
//!
//! The keeper waits for the tool and ends as it did (the same exit code, or
//! the same signal), so the runner reads the tool's status from it. When
//! the runner dies, the kernel sends the keeper SIGTERM and the keeper
//! SIGKILLs its group: the tool, all it started that stayed in the group,
//! and itself. A SIGTERM from anywhere else (a tool's `kill 0`) is ignored.
//! What left the group (`setsid`) is out of reach, as on a timeout.
//!
//! The keeper is a fork of the runner that never execs. It makes only
//! async-signal-safe system calls and allocates nothing, and it first
//! closes every file descriptor it inherited: the tool's pipes (whose ends
//! must close when the tool's do), the runner's sockets, and the pipe
//! through which `spawn` learns that the exec succeeded, which would hold
//! `spawn` until the tool ended.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;
use nix::libc;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, kill, killpg, sigaction};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpgrp, getpid, getppid};

/// The runner's process id, in the keeper (its own copy of this static):
/// what the SIGTERM handler compares the parent with.
static RUNNER: AtomicI32 = AtomicI32::new(0);

/// Run in the child between fork and exec (`pre_exec`), after it made its
/// own process group: returns in the tool's process, which goes on to exec;
/// in the keeper it does not return.
///
/// # Safety
///
/// Only in a child of `runner` between fork and exec, where the caller
/// must only make async-signal-safe calls: so does this.
pub(crate) unsafe fn split_off_the_tool(runner: Pid) -> std::io::Result<()> {
    RUNNER.store(runner.as_raw(), Ordering::Relaxed);
    // The handler is in place before the signal is asked for, and the
    // parent checked after: a runner that died in between is not missed.
    set_handler(Signal::SIGTERM, SigHandler::Handler(on_sigterm))?;
    // A handler the runner installed (tokio's) must not run here; the
    // default still leaves the tool's status for waitpid.
    set_handler(Signal::SIGCHLD, SigHandler::SigDfl)?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    if getppid() != runner {
        end_the_group();
    }
    let keeper = getpid();
    // SAFETY: fork is async-signal-safe; each side goes on as said above.
    match unsafe { fork() }? {
        ForkResult::Child => {
            set_handler(Signal::SIGTERM, SigHandler::SigDfl)?;
            // A keeper SIGKILLed alone (a call dropped) takes the tool along.
            die_with_parent(keeper)
        }
        ForkResult::Parent { child } => keep(child),
    }
}

/// Runs in the tool's process between fork and exec: the kernel SIGKILLs
/// it when `keeper` dies, even by SIGKILL. The signal follows the thread
/// that forked. A keeper that died before the request took effect is caught
/// by asking for the parent again; the tool then does not start.
fn die_with_parent(keeper: Pid) -> std::io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    if getppid() != keeper {
        return Err(Errno::ESRCH.into());
    }
    Ok(())
}

fn set_handler(signal: Signal, handler: SigHandler) -> Result<(), Errno> {
    let action = SigAction::new(handler, SaFlags::SA_RESTART, SigSet::empty());
    // SAFETY: the handlers set here make only async-signal-safe calls.
    unsafe { sigaction(signal, &action) }.map(drop)
}

extern "C" fn on_sigterm(_: libc::c_int) {
    // The kernel reparents the keeper before it signals the runner's death.
    if getppid().as_raw() != RUNNER.load(Ordering::Relaxed) {
        end_the_group();
    }
}

fn end_the_group() -> ! {
    let _ = killpg(getpgrp(), Signal::SIGKILL);
    // SAFETY: _exit is async-signal-safe; reached only if the kill failed.
    unsafe { libc::_exit(137) }
}

/// The keeper's life: wait for the tool, then end as it did.
fn keep(tool: Pid) -> ! {
    close_inherited_descriptors();
    let status = loop {
        match waitpid(tool, None) {
            Err(Errno::EINTR) => continue,
            status => break status,
        }
    };
    match status {
        // SAFETY (both): _exit is async-signal-safe.
        Ok(WaitStatus::Exited(_, code)) => unsafe { libc::_exit(code) },
        Ok(WaitStatus::Signaled(_, signal, _)) => end_by(signal),
        _ => unsafe { libc::_exit(1) },
    }
}

/// Ends the keeper by `signal`, as the tool ended, without a core dump of
/// its own.
fn end_by(signal: Signal) -> ! {
    let _ = nix::sys::prctl::set_dumpable(false);
    let _ = set_handler(signal, SigHandler::SigDfl);
    let _ = kill(getpid(), signal);
    // SAFETY: _exit is async-signal-safe; reached for a signal that does
    // not end a process by default, which cannot have ended the tool.
    unsafe { libc::_exit(128 + signal as i32) }
}

/// Closes every descriptor, 0, 1 and 2 included: the keeper needs none.
fn close_inherited_descriptors() {
    // SAFETY: close_range(2) takes plain integers; it closes what this process holds.
    let closed = unsafe { libc::syscall(libc::SYS_close_range, 0, libc::c_uint::MAX, 0) } == 0;
    if closed {
        return;
    }
    // Kernels before 5.9 have no close_range: one close per possible
    // descriptor, up to a bound far above what a runner holds.
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into `limit`, which lives on this stack.
    let most = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 { limit.rlim_cur } else { 0 };
    for fd in 0..most.clamp(1024, 1 << 16) as libc::c_int {
        // SAFETY: closing a descriptor this process may not hold fails harmlessly.
        unsafe { libc::close(fd) };
    }
}
