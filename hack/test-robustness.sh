#!/usr/bin/env bash
# test-robustness.sh runs the tests tagged robustness — leaks measured on
# the heap and in goroutines, outages of the API server, the short seeded
# fault campaign — each group in a test process of its own, the processes
# side by side: what one test leaves behind would blur another's leak
# measures, and most of their time is spent waiting (faults, outages,
# churn against the API server), not computing.
#
# Usage: hack/test-robustness.sh [GO]   (GO: the go command, default go)
# Each argument group is PACKAGE:REGEXP; + joins tests run in one process.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${1:-go}
groups=(
	"./engine/:TestTriggerChurnDoesNotLeak"
	"./engine/:TestReloadCyclesDoNotLeak"
	"./engine/:TestAPIServerRestart+TestWatchExpiry"
	"./internal/campaign/:TestCampaign"
)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
for i in "${!groups[@]}"; do
	pkg=${groups[$i]%%:*}
	run="^($(echo "${groups[$i]#*:}" | tr + '|'))\$"
	echo "go test -tags robustness -run '$run' $pkg"
	"$GO" test -tags robustness -count=1 -timeout=20m -run "$run" "$pkg" > "$out/$i.log" 2>&1 &
	pids+=($!)
done
failed=0
for i in "${!groups[@]}"; do
	if wait "${pids[$i]}"; then
		echo "--- ok: ${groups[$i]}"
		tail -n 1 "$out/$i.log"
	else
		failed=1
		echo "--- FAILED: ${groups[$i]}"
		cat "$out/$i.log"
	fi
done
exit $failed
