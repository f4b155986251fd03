import json,sys
rows={}
for f in ('results/A.jsonl','results/B.jsonl'):
    for l in open(f):
        r=json.loads(l)
        if r.get('ok'): rows[(r['row'],r['seed'])]=r['summary']
d1=rows.get(('decoupled',1)); d2=rows.get(('decoupled',2)); p1=rows.get(('ddp',1))
def b(s): return s['bytes_up']+s['bytes_down']
print('d1',d1['final_val_loss'],b(d1),d1['outer_steps'],d1['wall_s'])
if d2: print('d2',d2['final_val_loss'],b(d2),d2['outer_steps'],d2['wall_s'])
if p1: print('p1',p1['final_val_loss'],b(p1))
ddp1=p1['final_val_loss'] if p1 else 2.0595; ddp2=2.0726; ddpb=b(p1) if p1 else 10011648000
print('ratio1',d1['final_val_loss']/ddp1, ddpb/b(d1))
if d2: print('ratio2',d2['final_val_loss']/ddp2, ddpb/b(d2)); print('mean', (d1['final_val_loss']+d2['final_val_loss'])/2/((ddp1+ddp2)/2), ddpb/((b(d1)+b(d2))/2))
