source bench/device_unpack.sh
cd $OUT
timeout 200 test_kv_gpu > test_kv_gpu.log 2>&1; echo "test_kv_gpu rc $?: $(tail -1 test_kv_gpu.log | cut -c1-200), $(grep -c FAIL test_kv_gpu.log) FAIL"
run() { # NAME ENV...
  local name=$1; shift
  env "$@" timeout 130 qevict generate --shape llama3-8b --json --ignore-eos --device 0 --batch 8 --prompt-len 32768 -n 128 $POL > eng_$name.json 2> eng_$name.err
  echo "$name rc $?"
  python3 -c "
import json
for l in open('eng_$name.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; m=j['memory']; r=j['ranks'][0]; print('engine $name TPOT ms %.3f TTFT ms %.1f'%(s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3), 'eager', j['graphs']['eager_steps'], 'faults', m.get('pool_faults'), 'route ms', m.get('routing_gpu_ms_prefill'), m.get('routing_passes_prefill'), m.get('routing_gpu_ms_decode'), 'peak', r['pool_units_peak'], 'of', r['pool_units'])"
}
POL="--policy qevict --budget 0.2" run q_default QE_X=1
POL="--policy qevict --budget 0.2" run q_nolead QE_CUDA_ATTN_LEAD=0
POL="--policy qevict --budget 0.2" run q_order1 QE_CUDA_ATTN_LEAD=1
POL="" run full_default QE_X=1
POL="" run full_order1 QE_CUDA_ATTN_LEAD=1
tar czf res.tgz --remove-files *.json *.err *.log
