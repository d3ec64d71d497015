# Shared by the scripts that set up a tier's own venv (setup_vllm.sh, setup_trainers.sh):
# a log and a failure file under .eaglegen/, a venv made afresh, and a marker naming the pins
# it was built with. Source it, then call venv_setup NAME VENV before the rest.

venv_setup() {  # NAME VENV: sets name, venv, marker, log, failed; clears the old failure
  name="$1" venv="$2"
  marker="$venv/.eaglegen-installed"
  failed=".eaglegen/$name-setup.failed"
  log=".eaglegen/$name-setup.log"
  mkdir -p .eaglegen
  rm -f "$failed"
  : >"$log"
}

fail() {  # MESSAGE: said on stderr and kept in the failure file the test tier shows
  printf '%s (log: %s)\n' "$1" "$log" | tee "$failed" >&2
  tail -n 20 "$log" >&2 || true
  exit 1
}

venv_ready() {  # PINS: true when the venv was completely built with exactly these pins
  [ "$(cat "$marker" 2>/dev/null)" = "$1" ] && [ -x "$venv/bin/python" ]
}

venv_fresh() {  # a new, empty venv with a current pip (a half-built one is thrown away)
  rm -rf "$venv"
  python3 -m venv "$venv" >>"$log" 2>&1 || fail "$name: cannot create $venv"
  "$venv/bin/pip" install --upgrade pip >>"$log" 2>&1 || fail "$name: cannot upgrade pip"
}
