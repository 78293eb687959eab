// Hopper warpgroup MMA wrappers (wgmma.mma_async, sm_90a) for the accumulator widths in use.
//
// wgmma m64nNk16, fp32 accumulators: a warpgroup (4 consecutive warps, the first at a warp index
// divisible by 4) multiplies a 64 x 16 A by a 16 x N B. Accumulator layout per thread (warp w of
// the group, g = lane / 4, t = lane % 4): d[4j + 0..1] = (row 16w + g, cols 8j + 2t, + 1),
// d[4j + 2..3] = (row 16w + g + 8, same cols), j = 0 .. N/8 - 1, i.e. mma.sync's m16n8 C layout
// repeated over N. A from registers has mma.sync's m16n8k16 A layout for the warp's 16 rows.
// ss(): A and B from shared memory (descriptors); rs(): A from registers, B from shared memory.
// kTransA / kTransB: 0 = K-major, 1 = M- / N-major (16-bit types only). scale_d == 0 ignores
// the old accumulator (d = A B), otherwise d += A B. ss() and rs() with scale_d == 0 pass the
// accumulator as outputs only: as an input too, its old values stayed alive up to the MMA (a step's whole
// length for the backward's dQ) and made the consumers spill. The caller fences (wgmma_fence), commits and
// waits (wgmma_commit / wgmma_wait).
//
// Inline asm needs every accumulator register as its own operand, so the operand lists are
// written out once per N below (FLASHCOS_WGMMA_REGS_N / _OPS_N, and the numbers of the operands
// after them: _SS_P_N / _RS_P_N the scale-d predicate, _SS_T_N / _RS_T_N the rest);
// FLASHCOS_WGMMA_DEFINE then makes the bf16 and fp16 specialisations from them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashcos::cuda::hopper {

template <typename T, int N>
struct Wgmma;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHCOS_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define FLASHCOS_WGMMA_ASM(...) (void)d
#endif

#define FLASHCOS_WGMMA_REGS_8 "{%0,%1,%2,%3}"
#define FLASHCOS_WGMMA_OPS_8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define FLASHCOS_WGMMA_OUTS_8 "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
#define FLASHCOS_WGMMA_SS_P_8 "%6"
#define FLASHCOS_WGMMA_SS_T_8 ", %4, %5, p, 1, 1, %7, %8;"
#define FLASHCOS_WGMMA_RS_P_8 "%9"
#define FLASHCOS_WGMMA_RS_T_8 ", {%4,%5,%6,%7}, %8, p, 1, 1, %10;"
#define FLASHCOS_WGMMA_REGS_32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define FLASHCOS_WGMMA_OPS_32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define FLASHCOS_WGMMA_OUTS_32 "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15])
#define FLASHCOS_WGMMA_SS_P_32 "%18"
#define FLASHCOS_WGMMA_SS_T_32 ", %16, %17, p, 1, 1, %19, %20;"
#define FLASHCOS_WGMMA_RS_P_32 "%21"
#define FLASHCOS_WGMMA_RS_T_32 ", {%16,%17,%18,%19}, %20, p, 1, 1, %22;"
#define FLASHCOS_WGMMA_REGS_64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define FLASHCOS_WGMMA_OPS_64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FLASHCOS_WGMMA_OUTS_64 "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
#define FLASHCOS_WGMMA_SS_P_64 "%34"
#define FLASHCOS_WGMMA_SS_T_64 ", %32, %33, p, 1, 1, %35, %36;"
#define FLASHCOS_WGMMA_RS_P_64 "%37"
#define FLASHCOS_WGMMA_RS_T_64 ", {%32,%33,%34,%35}, %36, p, 1, 1, %38;"
#define FLASHCOS_WGMMA_REGS_72 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35}"
#define FLASHCOS_WGMMA_OPS_72 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
#define FLASHCOS_WGMMA_OUTS_72 "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35])
#define FLASHCOS_WGMMA_SS_P_72 "%38"
#define FLASHCOS_WGMMA_SS_T_72 ", %36, %37, p, 1, 1, %39, %40;"
#define FLASHCOS_WGMMA_RS_P_72 "%41"
#define FLASHCOS_WGMMA_RS_T_72 ", {%36,%37,%38,%39}, %40, p, 1, 1, %42;"
#define FLASHCOS_WGMMA_REGS_80 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}"
#define FLASHCOS_WGMMA_OPS_80 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define FLASHCOS_WGMMA_OUTS_80 "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39])
#define FLASHCOS_WGMMA_SS_P_80 "%42"
#define FLASHCOS_WGMMA_SS_T_80 ", %40, %41, p, 1, 1, %43, %44;"
#define FLASHCOS_WGMMA_RS_P_80 "%45"
#define FLASHCOS_WGMMA_RS_T_80 ", {%40,%41,%42,%43}, %44, p, 1, 1, %46;"
#define FLASHCOS_WGMMA_REGS_128 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define FLASHCOS_WGMMA_OPS_128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FLASHCOS_WGMMA_OUTS_128 "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
#define FLASHCOS_WGMMA_SS_P_128 "%66"
#define FLASHCOS_WGMMA_SS_T_128 ", %64, %65, p, 1, 1, %67, %68;"
#define FLASHCOS_WGMMA_RS_P_128 "%69"
#define FLASHCOS_WGMMA_RS_T_128 ", {%64,%65,%66,%67}, %68, p, 1, 1, %70;"
#define FLASHCOS_WGMMA_REGS_136 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67}"
#define FLASHCOS_WGMMA_OPS_136 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
#define FLASHCOS_WGMMA_OUTS_136 "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63]), "=f"(d[64]), "=f"(d[65]), "=f"(d[66]), "=f"(d[67])
#define FLASHCOS_WGMMA_SS_P_136 "%70"
#define FLASHCOS_WGMMA_SS_T_136 ", %68, %69, p, 1, 1, %71, %72;"
#define FLASHCOS_WGMMA_RS_P_136 "%73"
#define FLASHCOS_WGMMA_RS_T_136 ", {%68,%69,%70,%71}, %72, p, 1, 1, %74;"


#define FLASHCOS_WGMMA_DEFINE(CTYPE, PTX_TYPE, N)                                                         \
  template <>                                                                                           \
  struct Wgmma<CTYPE, N> {                                                                              \
    static constexpr int kRegs = N / 2;                                                                 \
    template <int kTransA, int kTransB>                                                                 \
    __device__ __forceinline__ static void ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,     \
                                              int scale_d) {                                            \
      if (scale_d == 0) {                                                                               \
        ss_init<kTransA, kTransB>(d, desc_a, desc_b);                                                   \
        return;                                                                                         \
      }                                                                                                 \
      FLASHCOS_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, " FLASHCOS_WGMMA_SS_P_##N ", 0;\n"           \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " "    \
                         FLASHCOS_WGMMA_REGS_##N FLASHCOS_WGMMA_SS_T_##N "\n}\n"                   \
                         : FLASHCOS_WGMMA_OPS_##N                                                       \
                         : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));         \
    }                                                                                                   \
    template <int kTransB>                                                                              \
    __device__ __forceinline__ static void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, \
                                              int scale_d) {                                            \
      if (scale_d == 0) {                                                                               \
        rs_init<kTransB>(d, a, desc_b);                                                                 \
        return;                                                                                         \
      }                                                                                                 \
      FLASHCOS_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, " FLASHCOS_WGMMA_RS_P_##N ", 0;\n"           \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " "    \
                         FLASHCOS_WGMMA_REGS_##N FLASHCOS_WGMMA_RS_T_##N "\n}\n"                   \
                         : FLASHCOS_WGMMA_OPS_##N                                                       \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d),       \
                           "n"(kTransB));                                                               \
    }                                                                                                   \
    /* d = A B, A from registers, d as outputs only (rs() with scale_d == 0). */                        \
    template <int kTransB>                                                                              \
    __device__ __forceinline__ static void rs_init(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) { \
      FLASHCOS_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, " FLASHCOS_WGMMA_RS_P_##N ", 0;\n"           \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " "    \
                         FLASHCOS_WGMMA_REGS_##N FLASHCOS_WGMMA_RS_T_##N "\n}\n"                   \
                         : FLASHCOS_WGMMA_OUTS_##N                                                      \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0), "n"(kTransB)); \
    }                                                                                                   \
    /* d = A B with d as outputs only (ss() with scale_d == 0). */                                      \
    template <int kTransA, int kTransB>                                                                 \
    __device__ __forceinline__ static void ss_init(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) { \
      FLASHCOS_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, " FLASHCOS_WGMMA_SS_P_##N ", 0;\n"           \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " "    \
                         FLASHCOS_WGMMA_REGS_##N FLASHCOS_WGMMA_SS_T_##N "\n}\n"                   \
                         : FLASHCOS_WGMMA_OUTS_##N                                                      \
                         : "l"(desc_a), "l"(desc_b), "r"(0), "n"(kTransA), "n"(kTransB));               \
    }                                                                                                   \
  };

FLASHCOS_WGMMA_DEFINE(__nv_bfloat16, "bf16", 8)
FLASHCOS_WGMMA_DEFINE(__half, "f16", 8)
FLASHCOS_WGMMA_DEFINE(__nv_bfloat16, "bf16", 32)
FLASHCOS_WGMMA_DEFINE(__half, "f16", 32)
FLASHCOS_WGMMA_DEFINE(__nv_bfloat16, "bf16", 64)
FLASHCOS_WGMMA_DEFINE(__half, "f16", 64)
FLASHCOS_WGMMA_DEFINE(__nv_bfloat16, "bf16", 72)
FLASHCOS_WGMMA_DEFINE(__half, "f16", 72)
FLASHCOS_WGMMA_DEFINE(__nv_bfloat16, "bf16", 80)
FLASHCOS_WGMMA_DEFINE(__half, "f16", 80)
FLASHCOS_WGMMA_DEFINE(__nv_bfloat16, "bf16", 128)
FLASHCOS_WGMMA_DEFINE(__half, "f16", 128)
FLASHCOS_WGMMA_DEFINE(__nv_bfloat16, "bf16", 136)
FLASHCOS_WGMMA_DEFINE(__half, "f16", 136)

#undef FLASHCOS_WGMMA_DEFINE
#undef FLASHCOS_WGMMA_ASM

}  // namespace flashcos::cuda::hopper
