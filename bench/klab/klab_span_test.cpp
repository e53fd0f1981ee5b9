// klab_span_test.cpp: the span path of kernels/resize_normalize.cu (load_span, span_byte,
// span_value, and span_mid of the exact-2x midpoint path) on the CPU, with the CUDA
// intrinsics it uses written in C++, against reading the same bytes one by one: every
// stride, encoding, channel and pixel of a group, at random alignments; also checks that
// no load reaches past the aligned vector holding the span's last byte or before the one
// holding its first. No GPU needed:
//   sed -n '/^\/\/ ---- The span path/,/^\/\/ True when the group/p' kernels/resize_normalize.cu > /tmp/span_part.inc
//   g++ -std=c++17 -O1 -I/tmp -o /tmp/t bench/klab/klab_span_test.cpp && /tmp/t
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <cmath>
typedef unsigned char u8; typedef unsigned int u32; typedef unsigned short u16;
#define __device__
#define __forceinline__ inline
#define RN_PX 4
#define RN_MIN_BLOCKS 5
#define RN_MIN_BLOCKS_SPAN 4
#define ENC_RGB8 0u
#define ENC_BGR8 1u
#define ENC_RGBA8 2u
#define ENC_BGRA8 3u
constexpr u32 enc_bpp(u32 e) { return e <= 1 ? 3 : 4; }
struct uint4 { u32 x, y, z, w; }; struct uint2 { u32 x, y; };
inline uint4 make_uint4(u32 a,u32 b,u32 c,u32 d){return {a,b,c,d};}
inline uint2 make_uint2(u32 a,u32 b){return {a,b};}
static uintptr_t g_max=0, g_min=~(uintptr_t)0; template<class T> T __ldg(const T* p){ T v; memcpy(&v,p,sizeof(T)); uintptr_t e=(uintptr_t)p+sizeof(T); if(e>g_max)g_max=e; if((uintptr_t)p<g_min)g_min=(uintptr_t)p; return v; }
inline u32 __funnelshift_r(u32 lo, u32 hi, u32 sh){ sh&=31; uint64_t v=((uint64_t)hi<<32)|lo; return (u32)(v>>sh); }
inline u32 __byte_perm(u32 x, u32 y, u32 s){ uint64_t v=((uint64_t)y<<32)|x; u32 r=0; for(int n=0;n<4;n++){ u32 sel=(s>>(4*n))&7; r|=(u32)((v>>(8*sel))&0xff)<<(8*n);} return r; }
inline float __uint_as_float(u32 u){ float f; memcpy(&f,&u,4); return f; }
inline float __fsub_rn(float a,float b){ volatile float r=a-b; return r; }
inline float __fmul_rn(float a,float b){ volatile float r=a*b; return r; }
inline float __fadd_rn(float a,float b){ volatile float r=a+b; return r; }
inline float __fmaf_rn(float a,float b,float c){ return std::fmaf(a,b,c); }
inline u32 __dp4a(u32 a, u32 b, u32 c){ for(int i=0;i<4;i++) c+=((a>>(8*i))&255)*((b>>(8*i))&255); return c; }
inline float lerp_rn(float a, float b, float w) { return __fadd_rn(__fmul_rn(a, __fsub_rn(1.0f, w)), __fmul_rn(b, w)); }
#include "span_part.inc"
template<u32 ENC,int S,int K,int CH> bool check_one(const u8* row0,const u8* row1,float wx,float wy){
  constexpr int SPAN=(3*S+2)*enc_bpp(ENC); constexpr int NW=(SPAN+3)/4;
  u32 a0[NW],a1[NW]; g_max=0; g_min=~(uintptr_t)0; load_span<SPAN>(row0,a0);
  uintptr_t last=(uintptr_t)row0+SPAN-1; uintptr_t lim=(last|7)+1;
  if (g_max>lim || g_min<((uintptr_t)row0&~(uintptr_t)7)) { printf("OVERREAD S %d span %d: max %lu lim %lu\n",S,SPAN,(unsigned long)g_max,(unsigned long)lim); return false; }
  load_span<SPAN>(row1,a1);
  float v=span_value<ENC,S,K,CH>(a0,a1,wx,wy);
  constexpr int bpp=enc_bpp(ENC); constexpr bool bgr=ENC==ENC_BGR8||ENC==ENC_BGRA8;
  int off= CH==1?1:(CH==0? (bgr?2:0) : (bgr?0:2));
  float s00=row0[S*K*bpp+off], s01=row0[(S*K+1)*bpp+off], s10=row1[S*K*bpp+off], s11=row1[(S*K+1)*bpp+off];
  float r=lerp_rn(lerp_rn(s00,s01,wx),lerp_rn(s10,s11,wx),wy);
  if (memcmp(&v,&r,4)) { printf("MISMATCH ENC %u S %d K %d CH %d: %f vs %f (m0 %lu)\n",ENC,S,K,CH,v,r,(unsigned long)((uintptr_t)row0&7)); return false; }
  if constexpr (S == 2) {  // the midpoint path: the lerps' bits at weights 0.5
    float m=span_mid<ENC,K,CH>(a0,a1), h=lerp_rn(lerp_rn(s00,s01,0.5f),lerp_rn(s10,s11,0.5f),0.5f);
    if (memcmp(&m,&h,4)) { printf("MIDPOINT MISMATCH ENC %u K %d CH %d: %f vs %f\n",ENC,K,CH,m,h); return false; }
  }
  return true;
}
template<u32 ENC,int S> int run(const u8* buf, size_t n){
  int bad=0;
  for(int t=0;t<2000;t++){
    size_t o0=rand()%(n-100), o1=rand()%(n-100);
    float wx=(rand()%1000)/1000.f, wy=(rand()%1000)/1000.f;
#define C(K,CH) bad+=!check_one<ENC,S,K,CH>(buf+o0,buf+o1,wx,wy);
    C(0,0)C(0,1)C(0,2)C(1,0)C(1,1)C(1,2)C(2,0)C(2,1)C(2,2)C(3,0)C(3,1)C(3,2)
  }
  return bad;
}
int main(){
  size_t n=1<<16; u8* buf=(u8*)aligned_alloc(64,n+64); for(size_t i=0;i<n+64;i++) buf[i]=rand()&255;
  int bad=0;
  bad+=run<ENC_RGB8,2>(buf,n); bad+=run<ENC_RGB8,3>(buf,n); bad+=run<ENC_BGR8,2>(buf,n); bad+=run<ENC_BGR8,3>(buf,n);
  bad+=run<ENC_RGBA8,2>(buf,n); bad+=run<ENC_RGBA8,3>(buf,n); bad+=run<ENC_BGRA8,2>(buf,n); bad+=run<ENC_BGRA8,3>(buf,n);
  printf("span path: %d mismatches\n",bad); return bad!=0;
}
