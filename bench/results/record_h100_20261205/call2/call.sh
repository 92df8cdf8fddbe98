# call 2 (2026-12-05, twentieth session): GPU tests, greedy GPU == CPU, and the engine record
export PACK=carry/p2; source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/models
M=$QE_SHARED_MODELS
mkdir -p $OUT/t
for dev in cpu gpu; do
  extra=""; [ $dev = gpu ] && extra="--device 0"
  timeout 60 qevict generate --model "$M/stories260K.gguf" --prompt "Once upon a time" -n 200 --ignore-eos --json $extra > $OUT/t/stories_$dev.json 2> $OUT/t/stories_$dev.err
  echo "stories $dev rc $?"
done
python3 - $OUT/t <<'PY'
import json, sys
def ids(f):
    for l in open(f):
        if l.startswith('{'):
            j = json.loads(l); return j.get('ids') or j.get('tokens')
a, b = ids(sys.argv[1] + '/stories_cpu.json'), ids(sys.argv[1] + '/stories_gpu.json')
flat = lambda x: x[0] if x and isinstance(x[0], list) else x
a, b = flat(a), flat(b)
print('stories260K 200 greedy tokens, GPU == CPU:', a == b, 'n', len(a or []), len(b or []),
      'first diff', next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None))
PY
(cd $OUT && tar czf tests.tgz --remove-files t)
timeout 480 bash bench/gpu_record.sh 2>&1 | tail -30
