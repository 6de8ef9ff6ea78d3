#!/usr/bin/env python3
# Measures how much of each CUDA op file repeats its CPU twin: for every ops/<name>.cu with an
# ops/<name>.cc, the substantive .cu lines (not blank, comments, #includes, braces or namespace
# lines) that stand in runs of 3 or more consecutive lines found, in the same order, in the .cc.
# Usage: tools/op_pair_dups.py ops  (issue 18's measure: every pair at most 10 % of its .cu).
import sys,glob,os,re
def subst(path):
    out=[]
    for l in open(path):
        s=l.strip()
        if not s or s.startswith('//') or s.startswith('#include'): continue
        if re.fullmatch(r'[{}();,\s]*',s): continue
        if s in ('} else {','public:','private:','};','namespace keel {','}  // namespace keel','namespace {','}  // namespace'): continue
        out.append(s)
    return out
tot_cu=tot_dup=0
for cu in sorted(glob.glob(sys.argv[1]+'/*.cu')):
    cc=cu[:-3]+'.cc'
    if not os.path.exists(cc): continue
    a=subst(cu); b=subst(cc)
    # runs of >=3 consecutive cu lines each present in cc, in same order consecutive in cc
    bset=set(zip(b,b[1:],b[2:]))
    covered=[False]*len(a)
    for i in range(len(a)-2):
        if (a[i],a[i+1],a[i+2]) in bset:
            covered[i]=covered[i+1]=covered[i+2]=True
    d=sum(covered); tot_cu+=len(a); tot_dup+=d
    print(f"{os.path.basename(cu):22s} {d:4d}/{len(a):4d} {100*d/max(1,len(a)):5.1f}%")
print(f"{'total':22s} {tot_dup:4d}/{tot_cu:4d} {100*tot_dup/tot_cu:5.1f}%")
