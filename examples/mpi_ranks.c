/* One MPI rank per device: each rank picks its device from its rank on the
 * node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), or OMPI_COMM_WORLD_LOCAL_RANK
 * / MV2_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID before MPI_Init), touches only
 * that device, and reports its memory with an MPI reduction.
 *
 * Run: mpirun -np 2 example_mpi_ranks
 * (ctest: on the simulator with GPUMEM_SIM_DEVICES=2x16GiB.) Another common
 * setup gives each rank its own CUDA_VISIBLE_DEVICES; then every rank sees
 * one device, ordinal 0, and this program uses it.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>

#include <gpumem.h>

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    gpumem_status st_ = (call);                                                                        \
    if (st_ != GPUMEM_OK) {                                                                            \
      fprintf(stderr, "rank %d: %s:%d: %s: %s\n", world_rank, __FILE__, __LINE__, #call,              \
              gpumem_status_name(st_));                                                                \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                    \
    }                                                                                                  \
  } while (0)

static int world_rank = -1;

/* The local rank from the launcher's environment, known before MPI_Init; -1 if none. */
static int env_local_rank(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                        "SLURM_LOCALID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return -1;
}

int main(int argc, char **argv) {
  int early_local = env_local_rank(); /* usable to set CUDA_VISIBLE_DEVICES before any CUDA call */
  MPI_Init(&argc, &argv);
  int world_size;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);

  /* The portable way: the ranks that share this node's memory. */
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
  int local_rank, local_size;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  if (early_local >= 0 && early_local != local_rank) {
    fprintf(stderr, "rank %d: launcher local rank %d != MPI_COMM_TYPE_SHARED rank %d\n", world_rank, early_local,
            local_rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  gpumem_context *ctx;
  CHECK(gpumem_create(NULL, &ctx)); /* touches no device */
  int ndev = 0;
  CHECK(gpumem_device_count(ctx, &ndev));
  int dev = local_rank % ndev;
  if (local_size > ndev && local_rank == 0)
    fprintf(stderr, "note: %d ranks share %d device(s) on this node\n", local_size, ndev);

  gpumem_device_info info = {.struct_size = sizeof info};
  CHECK(gpumem_device_get_info(ctx, dev, &info));

  /* Work of this rank: a few arrays whose size depends on the rank. */
  void *a[4];
  for (int i = 0; i < 4; i++) CHECK(gpumem_alloc(ctx, dev, (size_t)(world_rank + 1) * (8u << 20), NULL, &a[i]));
  gpumem_stats st = {.struct_size = sizeof st};
  CHECK(gpumem_get_stats(ctx, dev, &st));
  int touched_other = 0; /* no pool on any device but ours */
  for (int d = 0; d < ndev; d++) {
    if (d == dev) continue;
    gpumem_stats o = {.struct_size = sizeof o};
    CHECK(gpumem_get_stats(ctx, d, &o));
    if (o.reserved_bytes != 0) touched_other = 1;
  }

  printf("rank %d/%d (local %d/%d): device %d %s (%s), allocated %.0f MiB, reserved %.0f MiB\n", world_rank,
         world_size, local_rank, local_size, dev, info.uuid, gpumem_backend_name(ctx), st.allocated_bytes / 1048576.0,
         st.reserved_bytes / 1048576.0);
  fflush(stdout);

  unsigned long long mine = st.allocated_bytes, total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  /* The ranks of a node must have distinct devices while there are enough. */
  int *devs = malloc(sizeof(int) * (size_t)local_size);
  if (!devs) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Allgather(&dev, 1, MPI_INT, devs, 1, MPI_INT, node);
  int shared = 0;
  for (int r = 0; r < local_size; r++)
    if (r != local_rank && devs[r] == dev) shared = 1;
  free(devs);
  if (shared && local_size <= ndev) fprintf(stderr, "rank %d: device %d is used by another rank\n", world_rank, dev);

  int bad = (shared && local_size <= ndev) || touched_other || mine < (unsigned long long)(world_rank + 1) * (32u << 20);
  int any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world_rank == 0) printf("all ranks: %.0f MiB allocated in total\n", total / 1048576.0);

  for (int i = 0; i < 4; i++) CHECK(gpumem_free(ctx, a[i], NULL));
  CHECK(gpumem_trim(ctx, dev, 0, NULL));
  CHECK(gpumem_destroy(ctx, 0));
  MPI_Comm_free(&node);
  MPI_Finalize();
  return any_bad ? EXIT_FAILURE : EXIT_SUCCESS;
}
