"""Compare two bench rows files by item id: replies, emotions, strategies and scores."""
import json, sys
def rows(p):
    out={}
    for line in open(p):
        r=json.loads(line); out[r["id"]]=r
    return out
a,b=rows(sys.argv[1]),rows(sys.argv[2])
order=[json.loads(l)["id"] for l in open(sys.argv[1])]
common=[i for i in order if i in b]
same_reply=[i for i in common if a[i]["prediction"].get("response")==b[i]["prediction"].get("response")]
same_all=[i for i in common if a[i]["prediction"]==b[i]["prediction"]]
score_diff=[abs(a[i]["score"]-b[i]["score"]) for i in common]
mean=lambda xs: sum(xs)/len(xs) if xs else None
rec={"before_rows":sys.argv[1],"after_rows":sys.argv[2],"items_compared":len(common),
     "identical_replies":len(same_reply),"identical_predictions":len(same_all),
     "max_abs_score_difference":max(score_diff) if score_diff else None,
     "mean_score_before":mean([a[i]["score"] for i in common]),"mean_score_after":mean([b[i]["score"] for i in common]),
     "differing":[{"id":i,"before":a[i]["prediction"].get("response"),"after":b[i]["prediction"].get("response")} for i in common if i not in same_reply]}
print(json.dumps(rec,indent=1))
