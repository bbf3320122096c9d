"""Time the 26-layer nf4 scan of benchmarks/nf4_layout.py on a TPU chip: bf16, the old flat-block layout and the
half-column layout (maxpost.quant now), the gradient to x, median of 7 calls. Run on a TPU host:
    PYTHONPATH=$PWD python benchmarks/nf4_layout_chip.py"""
import time,jax,jax.numpy as jnp,numpy as np
from maxpost.quant import nf4_values
B,H,M,L=2048,1152,6912,26;D=jnp.bfloat16
def flat(q,s):
 c,a=q;i=jnp.stack([c&15,c>>4],-1).reshape(*c.shape[:-1],64);return(nf4_values(i)*a[...,None]).reshape(s).astype(D)
def half(q,s):
 c,a=q;return(nf4_values(jnp.concatenate([c&15,c>>4],-1))*jnp.repeat(a,64,-1)).astype(D)
def mk(f,s):
 if f is None:return lambda x,w:jnp.matmul(x,w,preferred_element_type=jnp.float32).astype(D)
 @jax.custom_vjp
 def m(x,q):return jnp.matmul(x,f(q,s),preferred_element_type=jnp.float32).astype(D)
 m.defvjp(lambda x,q:(m(x,q),q),lambda q,g:(jnp.matmul(g,f(q,s).T,preferred_element_type=jnp.float32).astype(D),None))
 return m
k=jax.random.key(0)
def W(n,i,o,l):
 if n=="bf16":return jax.random.normal(k,(l,i,o),D)
 c=jax.random.randint(k,(l,i*o//64,32) if n=="flat" else (l,i,o//2),0,255).astype(jnp.uint8)
 a=jax.random.uniform(k,(l,i*o//64) if n=="flat" else (l,i,o//64))
 return c,a
x=jax.random.normal(k,(B,H),D)
for n,f in (("bf16",None),("flat",flat),("half",half)):
 u,d=mk(f,(H,M)),mk(f,(M,H))
 def loss(x,wg,wd):
  return jax.lax.scan(lambda h,w:(d(u(h,w[0]),w[1]),None),x,(wg,wd))[0].astype(jnp.float32).sum()
 g=jax.jit(jax.grad(loss));wg,wd=W(n,H,M,L),W(n,M,H,L)
 jax.block_until_ready(g(x,wg,wd));ts=[]
 for _ in range(7):
  t=time.perf_counter();jax.block_until_ready(g(x,wg,wd));ts.append(time.perf_counter()-t)
 print(n,"scan26 fwd+bwd ms median",round(1e3*sorted(ts)[3],2),flush=True)
