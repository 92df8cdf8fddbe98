"""The fragment maps of attn_block's SW tile (tests/kernels/attn_block.cu: fb_sscores, fb_tile
with fb_sstate), checked on the CPU: ldmatrix (.x4 and .trans) over the swizzled stage, mma
m16n8k16 and movmatrix.trans simulated by their PTX fragment layouts, for every warp of a
64-token tile: S^T = K Q^T and O^T = V^T P against numpy. Written in the thirty-third session
(2026-12-06), when no device machine could be started; two planted address mistakes (the PV's
key and chunk bits swapped; the scores' the same) print WRONG. Usage: python3 sw_fragments.py"""
import numpy as np
rng=np.random.default_rng(1)
TK,NW,HD=64,4,128; KW=TK//NW
K=rng.standard_normal((TK,HD)); V=rng.standard_normal((TK,HD)); Q=rng.standard_normal((8,HD)); G=4; Q[G:]=0
# stage: swizzled rows of 256 bytes -> store as [row][chunk][8 elems] at swizzled chunk
def store(X):
    st=np.zeros((TK,16,8))
    for r in range(TK):
        for c in range(16): st[r][c^(r&7)]=X[r,8*c:8*c+8]
    return st
KS,VS=store(K),store(V)
def rowchunk(st,r,c): return st[r][c^(r&7)]   # fb_swz(r,c)
def ldsm(st,addr):  # addr[lane]=(row,chunk): returns regs[i][lane] = (2 elems)
    regs=np.zeros((4,32,2))
    for i in range(4):
        for t in range(32):
            r,c=addr[8*i+t//4]; regs[i][t]=rowchunk(st,r,c)[2*(t%4):2*(t%4)+2]
    return regs
def ldsm_t(st,addr):
    regs=np.zeros((4,32,2))
    for i in range(4):
        for t in range(32):
            rows=[addr[8*i+2*(t%4)], addr[8*i+2*(t%4)+1]]
            regs[i][t]=[rowchunk(st,r,c)[t//4] for r,c in rows]
    return regs
def mma(C,a,b0,b1):  # C[lane][4], a[4][lane][2], b0/b1[lane][2]
    A=np.zeros((16,16)); B=np.zeros((16,8))
    for t in range(32):
        g,c=t//4,t%4
        A[g,2*c:2*c+2]=a[0][t]; A[g+8,2*c:2*c+2]=a[1][t]; A[g,2*c+8:2*c+10]=a[2][t]; A[g+8,2*c+8:2*c+10]=a[3][t]
        B[2*c:2*c+2,g]=b0[t]; B[2*c+8:2*c+10,g]=b1[t]
    D=A@B
    for t in range(32):
        g,c=t//4,t%4
        C[t][0:2]+=D[g,2*c:2*c+2]; C[t][2:4]+=D[g+8,2*c:2*c+2]
def movt(x):  # x[lane][2] rows of 8x8
    M=np.zeros((8,8))
    for t in range(32): M[t//4,2*(t%4):2*(t%4)+2]=x[t]
    return np.array([M.T[t//4,2*(t%4):2*(t%4)+2] for t in range(32)])
qa=[[np.array([Q[t//4,16*k+2*(t%4):16*k+2*(t%4)+2] for t in range(32)]), np.array([Q[t//4,16*k+8+2*(t%4):16*k+8+2*(t%4)+2] for t in range(32)])] for k in range(8)]
ok=True
for warp in range(NW):
    kbase=warp*KW
    s=np.zeros((32,4))
    for k in range(8):
        ad=[(kbase+(l&7)+8*((l>>3)&1), 2*k+(l>>4)) for l in range(32)]
        mma(s,ldsm(KS,ad),qa[k][0],qa[k][1])
    Sref=K[kbase:kbase+16]@Q.T  # [key][head]
    for t in range(32):
        g,c=t//4,t%4
        ok&=np.allclose(s[t],[Sref[g,2*c],Sref[g,2*c+1],Sref[g+8,2*c],Sref[g+8,2*c+1]])
    P=rng.standard_normal((16,8))  # arbitrary probabilities [key][head]
    x0=np.array([[P[t//4,2*(t%4)],P[t//4,2*(t%4)+1]] for t in range(32)])
    x1=np.array([[P[t//4+8,2*(t%4)],P[t//4+8,2*(t%4)+1]] for t in range(32)])
    b0,b1=movt(x0),movt(x1)
    Oref=V[kbase:kbase+16].T@P  # [ch][head]
    for dp in range(8):
        o=np.zeros((32,4)); mi=[l>>3 for l in range(32)]
        ad=[(kbase+(l&7)+8*(mi[l]>>1), 2*dp+(mi[l]&1)) for l in range(32)]
        mma(o,ldsm_t(VS,ad),b0,b1)
        for t in range(32):
            g,c=t//4,t%4
            ok&=np.allclose(o[t],[Oref[16*dp+g,2*c],Oref[16*dp+g,2*c+1],Oref[16*dp+g+8,2*c],Oref[16*dp+g+8,2*c+1]])
print("fragment maps", "ok" if ok else "WRONG")
