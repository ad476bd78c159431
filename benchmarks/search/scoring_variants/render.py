# Renders problems/cuda_scoring/kernel.cu.tmpl with its defaults and the knob=value settings given:
# python3 render.py OUT.cu knob=value ...
import json,re,sys
j=json.load(open('problems/cuda_scoring/problem.json'))
k={a:b['default'] for a,b in j['knobs'].items()}
for a in sys.argv[2:]:x,y=a.split('=');assert x in k;k[x]=y
open(sys.argv[1],'w').write(re.sub(r'\$\{(\w+)\}',lambda m:str(k[m.group(1)]),open('problems/cuda_scoring/kernel.cu.tmpl').read()))
