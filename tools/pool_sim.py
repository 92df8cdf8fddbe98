# pool_sim.py: a CPU model (numpy) of the tiered GPU cache's unit allocator and QEvict routing
# (kernels/cuda/kern_cuda_route.cu) for the Llama-3.1-8B shape in a lockstep batch, written on
# 2026-11-30 to find why the pool ran out on long decodes (bench/history.md, "The pool fault of
# 2026-11-30"). It reproduced the measured peaks (54,272 units at 1,024 new tokens) before the
# fix; fix=True models the slab cut before the ledger phase (not the later demotion rounds). A
# model, not a test: its score model (lognormal importance times recency) is a guess. Usage:
# python3 tools/pool_sim.py [BATCH]
import numpy as np, sys, math
FULL, QUANT, EVIC = 0, 1, 2
PAGE = 32768; META = 77; LT = 9216; LED_PER = PAGE // LT; OMEGA = 8; SINK_WIN = 1; N_LOCAL = 32
Q = 0.7; NL = 32; UNIT = PAGE + META

ONSET=False
def pool_units(budget, n_seqs, cap):
    per = budget // NL; floor = 6 * UNIT
    hist = per - floor if per > floor else 0
    led = LT + META; rho = PAGE / (LED_PER * led); pressured = (1 - Q) + Q * rho
    phys = hist * max(pressured, 1.0, (1 + Q / LED_PER) if ONSET else 0)
    steady = int((floor + phys) / UNIT) + 3
    prompt = (cap + OMEGA - 1) // OMEGA
    base = n_seqs * steady * NL; room = max(base // 16, 2 * prompt)
    return base + min(n_seqs * prompt, room)

def run(N, B=32, prompt=256, slack=0, fix=False, seed=1, end_coalesce=False, sigma=1.2, verbose=False, frac=0.2):
    cap = prompt + N
    rng = np.random.default_rng(seed)
    fullkv = (6 + (cap + 7) // 8) * UNIT * NL
    budget = int(frac * fullkv); per = budget // NL; bhist = per - 6 * UNIT
    n_units = pool_units(budget, B, cap); n_units += n_units * slack // 100
    S = B * NL; W = (cap + 7) // 8
    tier = np.full((S, W), EVIC, np.int8); ntok = np.zeros((S, W), np.int32)
    page = np.full((S, W), -1, np.int64); ledg = np.full((S, W), -1, np.int64)
    score = np.zeros((S, W)); imp = rng.lognormal(0, sigma, (S, W))
    aged = np.zeros(S, np.int64)
    st = dict(page=list(range(n_units))[::-1], led=[], spare=[], low=n_units, err=0, faults=0)
    def pop_unit():
        if st['page']:
            u = st['page'].pop(); st['low'] = min(st['low'], len(st['page'])); return u
        st['err'] |= 1; st['faults'] += 1; return -1
    def pop_led():
        if st['led']: return st['led'].pop()
        u = pop_unit()
        if u < 0: return -1
        for k in range(1, LED_PER): st['spare'].append(u * LED_PER + k)
        return u * LED_PER
    def coalesce(low):
        if len(st['page']) >= low: return
        cnt = {}
        for i in st['led']: cnt[i // LED_PER] = cnt.get(i // LED_PER, 0) + 1
        keep = []
        for i in st['led']:
            u = i // LED_PER
            if cnt[u] < LED_PER: keep.append(i)
            elif i % LED_PER == 0: st['page'].append(u)
        st['led'] = keep
    def aged_of(L):
        lim = L - N_LOCAL; a = lim // OMEGA if lim > 0 else 0
        return max(a, SINK_WIN)
    def add_mass(pos, steps=1, rows=slice(None)):
        live = (tier[rows] != EVIC) & (ntok[rows] > 0)
        w = np.arange(W)
        rec = 1 + 4 * np.exp(-(pos - w * OMEGA) / 50.0)
        m = imp[rows] * rec[None, :] * live
        m /= m.sum(1, keepdims=True) + 1e-30
        score[rows] += m * steps
    def route(sls, L, force):
        low = max(n_units // 32, 64)
        coalesce(low)
        plan = {}
        A = aged_of(L)
        routed = []
        for j in sls:
            go = force or A > aged[j]
            if not go: continue
            aged[j] = A; routed.append(j)
            ws = [w for w in range(SINK_WIN, A) if ntok[j, w] > 0 and tier[j, w] != EVIC]
            full = sum(UNIT + (LT if ledg[j, w] >= 0 else 0) for w in ws)
            if full <= bhist:
                for w in ws: plan[(j, w)] = FULL
                continue
            order = sorted(ws, key=lambda w: (-score[j, w], w))
            fcap = int((1 - Q) * bhist); fu = 0; qu = 0; t = {}
            for w in order:
                t[w] = EVIC
                fc = UNIT + (LT if ledg[j, w] >= 0 else 0)
                if fu + fc <= fcap: fu += fc; t[w] = FULL
            qcap = bhist - fu
            for w in order:
                if t[w] != FULL and qu + LT + META <= qcap: qu += LT + META; t[w] = QUANT
            for w in order: plan[(j, w)] = t[w]
        ch = [(j, w, nt) for (j, w), nt in plan.items() if (FULL if tier[j, w] == FULL else QUANT) != nt]
        # EVICT
        for j, w, nt in ch:
            if nt == EVIC:
                if page[j, w] >= 0: st['page'].append(page[j, w])
                if ledg[j, w] >= 0: st['led'].append(ledg[j, w])
                page[j, w] = ledg[j, w] = -1; tier[j, w] = EVIC
        ch = [(j, w, nt) for j, w, nt in ch if nt != EVIC]
        # LEDGER
        if fix:
            need = sum(1 for j, w, nt in ch if tier[j, w] == FULL and nt == QUANT and ledg[j, w] < 0)
            short = need - len(st['led'])
            k = min((short + LED_PER - 1) // LED_PER, len(st['page'])) if short > 0 else 0
            for _ in range(k):
                u = pop_unit()
                st['led'].extend(u * LED_PER + i for i in range(LED_PER))
        ch2 = []
        for j, w, nt in ch:
            if tier[j, w] == FULL and nt == QUANT and ledg[j, w] < 0:
                l = pop_led()
                if l < 0: nt = EVIC
                else: ledg[j, w] = l
            ch2.append((j, w, nt))
        st['led'].extend(st['spare']); st['spare'] = []
        # DEMOTE
        for j, w, nt in ch2:
            if tier[j, w] == FULL and nt != FULL:
                st['page'].append(page[j, w]); page[j, w] = -1; tier[j, w] = QUANT if nt == QUANT else EVIC
        # PAGE + COMMIT
        for j, w, nt in ch2:
            if tier[j, w] == QUANT and nt == FULL:
                p = pop_unit()
                if p >= 0: page[j, w] = p; tier[j, w] = FULL
        if end_coalesce: coalesce(max(n_units // 32, 64, S + 64))
    def alloc(j, w):
        if page[j, w] >= 0 or tier[j, w] != EVIC or ntok[j, w] > 0: return
        p = pop_unit()
        if p < 0: return
        page[j, w] = p; tier[j, w] = FULL
    # prefill layer by layer
    nw = (prompt + 7) // 8
    for l in range(NL):
        sls = [s * NL + l for s in range(B)]
        for j in sls:
            for w in range(nw): alloc(j, w); ntok[j, w] = OMEGA if tier[j, w] == FULL else 0
        add_mass(prompt, 32, rows=np.array(sls))
        route(sls, prompt, True)
    # (prefill routes per layer right after that layer's pages; order above is pages-all-then-route,
    #  which only moves the prompt-time peak, not the decode one)
    peak_t = None; L = prompt
    for step in range(N):
        pos = L
        w = pos // OMEGA
        for j in range(S):
            if pos % OMEGA == 0: alloc(j, w)
            if tier[j, w] != EVIC or page[j, w] >= 0: ntok[j, w] += 1
        L += 1
        add_mass(pos)
        before = st['low']
        if aged_of(L) > aged_of(L - 1): route(list(range(S)), L, False)
        if st['low'] < before: peak_t = L
    inuse_end = n_units - len(st['page'])
    return dict(N=N, cap=cap, n_units=n_units, peak=n_units - st['low'], peak_per=(n_units - st['low']) / S,
                faults=st['faults'], peak_at_len=peak_t, bhist_units=bhist / UNIT)

if __name__ == '__main__':
    B = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    for N in (512, 768, 1024):
        for fix, slack in ((False, 0), (False, 15), (False, 30), (False, 60), (True, 0)):
            if N != 1024 and slack: continue
            print(run(N, B=B, fix=fix, slack=slack), 'fix' if fix else 'orig', flush=True)
