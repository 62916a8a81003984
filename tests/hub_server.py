"""A real Hub server on loopback for the Hub tests: `olah` (PyPI) serving git repositories from a mirror folder.

`olah` answers the Hub's HTTP API (`/api/models/...`, `/resolve/...`) for the git repositories found in its
`mirrors-path` (`<mirrors>/models/<org>/<name>`, one branch or commit per revision), with `offline = true` so it
never contacts huggingface.co. It is read-only: uploads are not served (the real upload test is opt-in).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

# olah answers 401 (its "not found" for everything) where the Hub answers 404 EntryNotFound: for a file or a folder
# missing from a revision that exists. Hub clients probe optional files (AutoTokenizer asks for tokenizer.model and
# lists additional_chat_templates/) and read a 404 as "absent" but a 401 as "no such repository". The launcher makes
# olah answer those as the Hub does; everything else is olah's own code.
_LAUNCH_OLAH = """
import sys
from olah import server_file_routes as routes
from olah.errors import error_entry_not_found_branch
from olah.mirror import repos
from olah.server import cli
from olah.server_access import build_repo_ref
from olah.server_mirror import has_local_mirror, load_local_mirror_payload

_get_tree = repos.LocalMirrorRepo.get_tree

def get_tree(self, commit_hash, path, recursive=False, expand=False):
    tree = _get_tree(self, commit_hash, path, recursive=recursive, expand=expand)
    if tree is None and _get_tree(self, commit_hash, "") is not None:
        return []  # the Hub: 404 EntryNotFound, which huggingface_hub's callers treat as an empty folder
    return tree

def entry_not_found(route):
    async def answer(app, repo_type, org, repo, commit, file_path, request):
        repo_ref = build_repo_ref(repo_type, org, repo)
        if has_local_mirror(app, repo_ref):
            logger = routes._get_logger(app)
            revision = load_local_mirror_payload(app, repo_ref, lambda r: _get_tree(r, commit, ""), logger)
            head = load_local_mirror_payload(app, repo_ref, lambda r: r.get_file_head(commit, file_path), logger)
            if revision is not None and head is None:
                return error_entry_not_found_branch(commit, file_path)
        return await route(app, repo_type, org, repo, commit, file_path, request)
    return answer

repos.LocalMirrorRepo.get_tree = get_tree
routes.file_head_common = entry_not_found(routes.file_head_common)
routes.file_get_common = entry_not_found(routes.file_get_common)
sys.argv[0] = "olah-cli"
sys.exit(cli())
"""
GIT = [
    "git",
    "-c",
    "user.name=modeling-attn tests",
    "-c",
    "user.email=tests@localhost",
    "-c",
    "init.defaultBranch=main",
]


def commit_folder(repository: Path, files: Path, branch: str = "main", message: str = "upload") -> str:
    """Commit the files of `files` as the whole content of `branch` of the git `repository`; return the commit."""
    repository.mkdir(parents=True, exist_ok=True)
    if not (repository / ".git").exists():
        subprocess.run([*GIT, "init", "-q", "-b", branch, str(repository)], check=True)
    else:
        subprocess.run([*GIT, "-C", str(repository), "checkout", "-q", "-B", branch], check=True)
    for old in repository.iterdir():
        if old.name != ".git":
            subprocess.run(["rm", "-rf", str(old)], check=True)
    subprocess.run(["cp", "-r", f"{files}/.", str(repository)], check=True)
    subprocess.run([*GIT, "-C", str(repository), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repository), "commit", "-q", "-m", message], check=True)
    return subprocess.run(
        [*GIT, "-C", str(repository), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def olah_server(mirrors: Path, workdir: Path, ready_repo: str, timeout: float = 60.0) -> Iterator[str]:
    """Run olah on 127.0.0.1 serving `mirrors`; yield its URL (for HF_ENDPOINT) once `ready_repo` answers."""
    port = _free_port()
    config = workdir / "olah.toml"
    config.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {port}\n'
        f'mirrors-path = ["{mirrors}"]\nrepos-path = "{workdir / "olah-cache"}"\n'
        "[accessibility]\noffline = true\n"
    )
    log = open(workdir / "olah.log", "w")  # noqa: SIM115 (closed below, after the server)
    server = subprocess.Popen(
        [sys.executable, "-c", _LAUNCH_OLAH, "-c", str(config)], cwd=workdir, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:  # olah's `GET /` errors; a repository's revision endpoint tells it is serving
            if server.poll() is not None:
                raise RuntimeError(
                    f"olah exited with {server.returncode}: {(workdir / 'olah.log').read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{url}/api/models/{ready_repo}/revision/main", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"olah did not serve {ready_repo} within {timeout} s")
            time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
