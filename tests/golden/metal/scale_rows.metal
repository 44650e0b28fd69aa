#include "tn_metal.h"
// tilenest: kernel scale_rows

struct tn_args_scale_rows {
    long s_R;  // offset 0
    long s_C;  // offset 8
};

kernel void scale_rows_scale_rows_0(
    const device float* b_x [[buffer(0)]], device float* b_y [[buffer(1)]], constant tn_args_scale_rows& tn_args [[buffer(2)]], device atomic_int* tn_status [[buffer(3)]], uint3 tn_tgpos [[threadgroup_position_in_grid]], uint3 tn_tpos [[thread_position_in_threadgroup]], uint3 tn_tgsize [[threads_per_threadgroup]], uint tn_lane [[thread_index_in_simdgroup]], uint tn_simd [[simdgroup_index_in_threadgroup]]) {
  const long S_R_w = tn_args.s_R;
  const long S_C_w = tn_args.s_C;
  const int S_R = (int)S_R_w;
  const int S_C = (int)S_C_w;
  int v_pid_1;
  int v_blk_2;
  int v_w_3;
  int v_i_4;
  int v_t_t0;
  int v_r_t1;
  int v_v_t2;
  int v_i_5;
  v_pid_1 = (int)tn_tgpos.x;
  v_blk_2 = ((int)v_pid_1);
  for (v_w_3 = 0; v_w_3 < 4; ++v_w_3) {
    threadgroup_barrier(mem_flags::mem_threadgroup | mem_flags::mem_device);
    for (v_i_4 = 0; v_i_4 < 1; ++v_i_4) {
      if (((((4 * ((int)v_blk_2)) + ((int)v_i_4) + ((int)v_w_3)) >= 0) && (((4 * ((int)v_blk_2)) + ((int)v_i_4) + ((int)v_w_3)) < S_R))) {
        v_t_t0 = (int)tn_tpos.x;  // thread loop over [0, 256)
        {
          {
            const int tn_nf_v_r_t1 = tn_clamp((tn_xfloordiv(((-4 * ((int)v_t_t0)) + S_C + -4), 1024) + 1), 0, ((int)((uint)(S_C + 1023) / 1024u)));
            if (tn_aligned(b_x, 16) && tn_multiple(S_C, 4) && tn_aligned(b_y, 16)) {  // full groups: 4 lanes, vector accesses
              #pragma unroll 4
              for (v_r_t1 = 0; v_r_t1 < tn_nf_v_r_t1; ++v_r_t1) {
                const tn_pack<float, 4> tn_vq_0_v_v_t2 = tn_vload<float, 4>(&b_x[((4 * (((int)v_blk_2) * S_C)) + (((int)v_i_4) * S_C) + (1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + (((int)v_w_3) * S_C))]);
                tn_pack<float, 4> tn_vs_0_v_v_t2;
                #pragma unroll
                for (v_v_t2 = 0; v_v_t2 < 4; ++v_v_t2) {
                  v_i_5 = ((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2));
                  tn_vs_0_v_v_t2.e[v_v_t2] = ((tn_vq_0_v_v_t2.e[v_v_t2] * 2.0f) + 1.0f);
                }
                tn_vstore<float, 4>(&b_y[((4 * (((int)v_blk_2) * S_C)) + (((int)v_i_4) * S_C) + (1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + (((int)v_w_3) * S_C))], tn_vs_0_v_v_t2);
              }
              for (v_r_t1 = tn_nf_v_r_t1; v_r_t1 < ((int)((uint)(S_C + 1023) / 1024u)); ++v_r_t1) {
                #pragma unroll
                for (v_v_t2 = 0; v_v_t2 < 4; ++v_v_t2) {
                  if ((((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2)) < S_C)) {
                    v_i_5 = ((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2));
                    b_y[((4 * (((int)v_blk_2) * S_C)) + (((int)v_i_4) * S_C) + ((int)v_i_5) + (((int)v_w_3) * S_C))] = ((b_x[((4 * (((int)v_blk_2) * S_C)) + (((int)v_i_4) * S_C) + ((int)v_i_5) + (((int)v_w_3) * S_C))] * 2.0f) + 1.0f);
                  }
                }
              }
            } else {
              for (v_r_t1 = 0; v_r_t1 < ((int)((uint)(S_C + 1023) / 1024u)); ++v_r_t1) {
                #pragma unroll
                for (v_v_t2 = 0; v_v_t2 < 4; ++v_v_t2) {
                  if ((((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2)) < S_C)) {
                    v_i_5 = ((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2));
                    b_y[((4 * (((int)v_blk_2) * S_C)) + (((int)v_i_4) * S_C) + ((int)v_i_5) + (((int)v_w_3) * S_C))] = ((b_x[((4 * (((int)v_blk_2) * S_C)) + (((int)v_i_4) * S_C) + ((int)v_i_5) + (((int)v_w_3) * S_C))] * 2.0f) + 1.0f);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

