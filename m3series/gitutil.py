"""Tiny project-agnostic git helpers on top of GitPython.

Every call runs with the user's configuration neutralised where it would
change bytes we write or read back (diff prefixes, colours, renames, hooks),
so that apply and export round-trip byte for byte on any machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import git

# Options that make diffs independent of the user's git config.
DIFF_OPTS = [
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--full-index",
    "--binary",
    "--src-prefix=a/",
    "--dst-prefix=b/",
]

_NEUTRAL_CONFIG = [
    "-c", "core.autocrlf=false",
    "-c", "core.safecrlf=false",
    "-c", "core.hooksPath=/dev/null",
    "-c", "commit.gpgsign=false",
    "-c", "diff.noprefix=false",
    "-c", "apply.whitespace=nowarn",
]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {"GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}
    if extra:
        env.update(extra)
    return env


def _execute(repo: git.Repo | Path | str, args, env, stdin, as_bytes: bool, strip: bool):
    r = repo if isinstance(repo, git.Repo) else git.Repo(repo)
    full_env = dict(os.environ)
    full_env.update(_env(env))
    kwargs = {"env": full_env, "stdout_as_string": not as_bytes,
              "strip_newline_in_stdout": strip}
    if stdin is not None:
        import tempfile

        with tempfile.TemporaryFile() as fh:
            fh.write(stdin.encode() if isinstance(stdin, str) else stdin)
            fh.seek(0)
            return r.git.execute(["git", *_NEUTRAL_CONFIG, *args], istream=fh, **kwargs)
    return r.git.execute(["git", *_NEUTRAL_CONFIG, *args], **kwargs)


def run(repo: git.Repo | Path | str, *args: str, env: dict[str, str] | None = None,
        stdin: str | bytes | None = None, strip: bool = True) -> str:
    """Run `git <args>` in a repository and return stdout (raises git.GitCommandError)."""
    return _execute(repo, args, env, stdin, as_bytes=False, strip=strip)


def raw(repo: git.Repo | Path | str, *args: str) -> bytes:
    """`git <args>` stdout as bytes (diffs, blobs): no decoding, no stripping."""
    return _execute(repo, args, None, None, as_bytes=True, strip=False)


def init(path: Path) -> git.Repo:
    path.mkdir(parents=True, exist_ok=True)
    repo = git.Repo.init(path)
    run(repo, "config", "user.name", "vllm-m3-series")
    run(repo, "config", "user.email", "series@localhost")
    return repo


def commit_all(repo: git.Repo, message: str, author: str, date: str) -> str:
    """Stage everything and commit with a fixed author and committer date; return the sha.

    Committer = author and committer date = author date make commits reproducible:
    the same base and series always yield the same hashes.
    """
    run(repo, "add", "-A", "--force", ".")
    name, email = split_ident(author)
    env = {
        "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email, "GIT_COMMITTER_DATE": date,
    }
    run(repo, "commit", "--quiet", "--allow-empty", "--no-verify", "--cleanup=verbatim",
        "-F", "-", env=env, stdin=message)
    return head(repo)


def split_ident(ident: str) -> tuple[str, str]:
    """'Name <mail>' -> ('Name', 'mail')."""
    name, _, rest = ident.partition("<")
    return name.strip(), rest.rstrip(">").strip()


def head(repo: git.Repo) -> str:
    return run(repo, "rev-parse", "HEAD")


def is_dirty(repo: git.Repo) -> bool:
    return bool(run(repo, "status", "--porcelain", "--untracked-files=all"))


def root_commit(repo: git.Repo) -> str:
    return run(repo, "rev-list", "--max-parents=0", "HEAD").splitlines()[-1]


def commits_since(repo: git.Repo, base: str) -> list[str]:
    out = run(repo, "rev-list", "--reverse", "--topo-order", f"{base}..HEAD")
    return out.split() if out else []


def changed_files(repo: git.Repo, old: str, new: str) -> list[tuple[str, str]]:
    """[(status, path)] between two commits, renames off (A, M, D, T)."""
    out = run(repo, "diff", "--no-renames", "--name-status", "-z", old, new, strip=False)
    parts = [p for p in out.split("\0") if p]
    return [(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]


def open_repo(path: Path | str) -> git.Repo | None:
    """The git repository at `path`, or None if there is none."""
    try:
        return git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None


def resolve(repo: git.Repo, spec: str) -> str | None:
    """The object name `spec` resolves to (`git rev-parse --verify`), or None."""
    rc, out, _ = run_full(repo, "rev-parse", "--verify", "--quiet", spec)
    return out.strip() if rc == 0 else None


def show_file(repo: git.Repo, rev: str, path: str) -> bytes:
    return raw(repo, "cat-file", "blob", f"{rev}:{path}")


def run_full(repo: git.Repo | Path | str, *args: str,
             stdin: str | bytes | None = None) -> tuple[int, str, str]:
    """`git <args>` without raising: (exit status, stdout, stderr), e.g. to read `apply -v`."""
    r = repo if isinstance(repo, git.Repo) else git.Repo(repo)
    env = dict(os.environ)
    env.update(_env())
    kwargs = {"env": env, "with_extended_output": True, "with_exceptions": False}
    cmd = ["git", *_NEUTRAL_CONFIG, *args]
    if stdin is None:
        status, out, err = r.git.execute(cmd, **kwargs)
    else:
        import tempfile

        with tempfile.TemporaryFile() as fh:
            fh.write(stdin.encode() if isinstance(stdin, str) else stdin)
            fh.seek(0)
            status, out, err = r.git.execute(cmd, istream=fh, **kwargs)
    return status, out, err
