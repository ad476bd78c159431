#!/usr/bin/env bash
# On the device (carry .carry): does Nsight Compute run inside kevo's candidate jail? Runs ncu on
# ncu_probe.cu's kernel plainly, then inside bubblewrap namespaces as kevo's jail makes them (user,
# PID, network, IPC and mount; /usr read-only; private /tmp; the NVIDIA device nodes), as root and
# as an unprivileged uid. Prints one line per way: the first CSV row ncu printed, or its last words.
set -uo pipefail
export PATH=$PWD/.carry/search:/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.carry/search${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p /tmp/probe && nvcc -O3 -arch=native -o /tmp/probe/ncu_probe benchmarks/search/ncu_probe.cu || exit 1
chmod -R a+rx /tmp/probe
ncu=$(readlink -f "$(command -v ncu)")
echo "ncu: $ncu"
jail=("$PWD/.carry/search/bwrap" --die-with-parent --new-session --unshare-all --as-pid-1 --ro-bind /usr /usr)
for top in /bin /sbin /lib /lib64; do
  if [ -L $top ]; then jail+=(--symlink "$(readlink $top)" $top); elif [ -d $top ]; then jail+=(--ro-bind $top $top); fi
done
jail+=(--ro-bind-try /etc/ld.so.cache /etc/ld.so.cache --proc /proc --dev /dev)
for d in /tmp /var/tmp /dev/shm /scratch; do jail+=(--size 67108864 --tmpfs $d); done
for n in /dev/nvidia*; do jail+=(--dev-bind "$n" "$n"); done
jail+=(--ro-bind-try /sys /sys --ro-bind-try /etc/alternatives /etc/alternatives --ro-bind-try /opt/nvidia /opt/nvidia --ro-bind /tmp/probe /run/kevo --chdir /scratch)
case $ncu in /usr/*) ;; *) jail+=(--ro-bind "$(dirname "$(dirname "$ncu")")" "$(dirname "$(dirname "$ncu")")");; esac
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
try() {
  local name=$1; shift
  local out
  out=$(timeout 120 env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$PWD/.carry/search" "$@" 2>&1)
  local rc=$?
  local row=$(echo "$out" | grep -m1 '"scale' )
  if [ -n "$row" ]; then echo "$name: OK (rc $rc) $row"; else echo "$name: FAILED (rc $rc): $(echo "$out" | tail -4 | tr '\n' ' ')"; fi
}
try "plain, root" "$ncu" --clock-control none --csv --metrics $metrics /tmp/probe/ncu_probe
try "jail, root" "${jail[@]}" -- "$ncu" --clock-control none --csv --metrics $metrics /run/kevo/ncu_probe
try "jail, uid 65534" setpriv --reuid=65534 --regid=65534 --clear-groups "${jail[@]}" -- "$ncu" --clock-control none --csv --metrics $metrics /run/kevo/ncu_probe
try "jail, uid 65534, HOME and TMPDIR" setpriv --reuid=65534 --regid=65534 --clear-groups "${jail[@]}" --setenv HOME /scratch --setenv TMPDIR /tmp -- "$ncu" --clock-control none --csv --metrics $metrics /run/kevo/ncu_probe
