#!/bin/sh
# A fake LLM tenant for the unit tests of package llmtenant (the real one is
# tenants/llm/tenant.mjs): run as `sh fake-tenant.sh -modules M -model MODE ...`, it
# behaves as MODE says.
while [ $# -gt 0 ]; do
  case $1 in -model) mode=$2; shift ;; esac
  shift
done
case $mode in
exit-early)
  echo "cannot find the binding" >&2
  exit 3 ;;
load-failed)
  echo '{"event":"error","code":"load_failed","message":"NoBinaryFoundError"}'
  echo '{"event":"exit","reason":"load_failed","status":1}'
  exit 1 ;;
serve)
  # Lines that are no events: one over the limit, one no JSON, one unknown event.
  head -c 1100000 /dev/zero | tr '\0' x; echo
  echo 'garbage'
  echo '{"event":"surprise"}'
  echo "{\"event\":\"ready\",\"rss_bytes\":1,\"model_bytes\":2,\"pid\":$$}"
  while IFS= read -r line; do
    id=$(printf '%s' "$line" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
    case $line in
    *'"prompt":"silent"'*) ;;
    *'"prompt":"refuse"'*) echo "{\"event\":\"error\",\"id\":\"$id\",\"code\":\"unloaded\",\"message\":\"freed\"}" ;;
    *'"prompt":"die"'*) exit 0 ;;
    *'"op":"generate"'*)
      # An error about a request nobody here waits for, then the answer.
      echo '{"event":"error","id":"nobody","code":"bad_request","message":"m"}'
      echo "{\"event\":\"request\",\"id\":\"$id\",\"tokens\":1,\"output\":[7]}" ;;
    *'"op":"free"'*) echo '{"event":"freed","rss_before_bytes":9,"rss_bytes":5}' ;;
    *'"op":"resume"'*) echo '{"event":"resumed","load_ms":3}' ;;
    *'"op":"stop"'*) echo '{"event":"exit","reason":"stop","status":0}'; exit 0 ;;
    esac
  done ;;
esac
