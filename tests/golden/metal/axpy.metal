#include "tn_metal.h"
// tilenest: kernel axpy

struct tn_args_axpy {
    float a_a;  // offset 0
    long s_N;  // offset 8
};

kernel void axpy_axpy_0(
    const device float* b_x [[buffer(0)]], const device float* b_y [[buffer(1)]], device float* b_out [[buffer(2)]], constant tn_args_axpy& tn_args [[buffer(3)]], device atomic_int* tn_status [[buffer(4)]], uint3 tn_tgpos [[threadgroup_position_in_grid]], uint3 tn_tpos [[thread_position_in_threadgroup]], uint3 tn_tgsize [[threads_per_threadgroup]], uint tn_lane [[thread_index_in_simdgroup]], uint tn_simd [[simdgroup_index_in_threadgroup]]) {
  const long S_N_w = tn_args.s_N;
  const float tn_s_a[1] = {tn_args.a_a};
  const int S_N = (int)S_N_w;
  const float tn_arg_a = tn_s_a[0];
  int v_pid_1;
  int v_p_2;
  int v_t_t0;
  int v_r_t1;
  int v_v_t2;
  int v_i_3;
  v_pid_1 = (int)tn_tgpos.x;
  v_p_2 = ((int)v_pid_1);
  v_t_t0 = (int)tn_tpos.x;  // thread loop over [0, 256)
  {
    {
      const int tn_nf_v_r_t1 = tn_clamp((tn_xfloordiv(((-4 * ((int)v_t_t0)) + (-1 * tn_xmax((-128 * ((int)v_p_2)), 0)) + tn_xmin(((-128 * ((int)v_p_2)) + S_N), 128) + -4), 1024) + 1), 0, tn_xfloordiv(((-1 * tn_xmax((-128 * ((int)v_p_2)), 0)) + tn_xmin(((-128 * ((int)v_p_2)) + S_N), 128) + 1023), 1024));
      if (tn_aligned(&b_x[((128 * ((int)v_p_2)) + (4 * ((int)v_t_t0)) + tn_xmax((-128 * ((int)v_p_2)), 0))], 16) && tn_aligned(&b_y[((128 * ((int)v_p_2)) + (4 * ((int)v_t_t0)) + tn_xmax((-128 * ((int)v_p_2)), 0))], 16) && tn_aligned(&b_out[((128 * ((int)v_p_2)) + (4 * ((int)v_t_t0)) + tn_xmax((-128 * ((int)v_p_2)), 0))], 16)) {  // full groups: 4 lanes, vector accesses
        #pragma unroll 4
        for (v_r_t1 = 0; v_r_t1 < tn_nf_v_r_t1; ++v_r_t1) {
          const tn_pack<float, 4> tn_vq_0_v_v_t2 = tn_vload<float, 4>(&b_x[((128 * ((int)v_p_2)) + (1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + tn_xmax((-128 * ((int)v_p_2)), 0))]);
          const tn_pack<float, 4> tn_vq_1_v_v_t2 = tn_vload<float, 4>(&b_y[((128 * ((int)v_p_2)) + (1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + tn_xmax((-128 * ((int)v_p_2)), 0))]);
          tn_pack<float, 4> tn_vs_0_v_v_t2;
          #pragma unroll
          for (v_v_t2 = 0; v_v_t2 < 4; ++v_v_t2) {
            v_i_3 = ((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2) + tn_xmax((-128 * ((int)v_p_2)), 0));
            tn_vs_0_v_v_t2.e[v_v_t2] = ((tn_arg_a * tn_vq_0_v_v_t2.e[v_v_t2]) + tn_vq_1_v_v_t2.e[v_v_t2]);
          }
          tn_vstore<float, 4>(&b_out[((128 * ((int)v_p_2)) + (1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + tn_xmax((-128 * ((int)v_p_2)), 0))], tn_vs_0_v_v_t2);
        }
        for (v_r_t1 = tn_nf_v_r_t1; v_r_t1 < tn_xfloordiv(((-1 * tn_xmax((-128 * ((int)v_p_2)), 0)) + tn_xmin(((-128 * ((int)v_p_2)) + S_N), 128) + 1023), 1024); ++v_r_t1) {
          #pragma unroll
          for (v_v_t2 = 0; v_v_t2 < 4; ++v_v_t2) {
            if ((((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2)) < ((-1 * tn_xmax((-128 * ((int)v_p_2)), 0)) + tn_xmin(((-128 * ((int)v_p_2)) + S_N), 128)))) {
              v_i_3 = ((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2) + tn_xmax((-128 * ((int)v_p_2)), 0));
              b_out[(((int)v_i_3) + (128 * ((int)v_p_2)))] = ((tn_arg_a * b_x[(((int)v_i_3) + (128 * ((int)v_p_2)))]) + b_y[(((int)v_i_3) + (128 * ((int)v_p_2)))]);
            }
          }
        }
      } else {
        for (v_r_t1 = 0; v_r_t1 < tn_xfloordiv(((-1 * tn_xmax((-128 * ((int)v_p_2)), 0)) + tn_xmin(((-128 * ((int)v_p_2)) + S_N), 128) + 1023), 1024); ++v_r_t1) {
          #pragma unroll
          for (v_v_t2 = 0; v_v_t2 < 4; ++v_v_t2) {
            if ((((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2)) < ((-1 * tn_xmax((-128 * ((int)v_p_2)), 0)) + tn_xmin(((-128 * ((int)v_p_2)) + S_N), 128)))) {
              v_i_3 = ((1024 * ((int)v_r_t1)) + (4 * ((int)v_t_t0)) + ((int)v_v_t2) + tn_xmax((-128 * ((int)v_p_2)), 0));
              b_out[(((int)v_i_3) + (128 * ((int)v_p_2)))] = ((tn_arg_a * b_x[(((int)v_i_3) + (128 * ((int)v_p_2)))]) + b_y[(((int)v_i_3) + (128 * ((int)v_p_2)))]);
            }
          }
        }
      }
    }
  }
}

