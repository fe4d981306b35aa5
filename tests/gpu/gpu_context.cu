/*
 * gpu_context: devices, identities, current device and contexts.
 *
 * Run it in a fresh process (it checks that nothing has a CUDA context when
 * it starts), under any CUDA_VISIBLE_DEVICES. With one GPU the cross-device
 * parts collapse to device 0; with two or more:
 *   - a thread with no context that uses only the LAST visible device leaves
 *     no primary context on any other device (cuDevicePrimaryCtxGetState),
 *     and nvidia-smi lists this process on that device's UUID only;
 *   - a thread whose current device is the last one, using device 0 through
 *     the pool, still has the last device current afterwards (cudaGetDevice
 *     and cuCtxGetCurrent);
 *   - per-device pools: trim and reset of one device leave the other alone,
 *     GPUMEM_ALL_DEVICES reaches all.
 * Always: gpumem_create and gpumem_device_count create no context; the UUID
 * and PCI bus id of every visible device match nvidia-smi's line for its
 * physical index; with CUDA_DEVICE_ORDER=PCI_BUS_ID and a numeric
 * CUDA_VISIBLE_DEVICES list, physical_index[i] is the i-th number of it.
 */
#include "gpu_util.h"

#include <ctype.h>
#include <cuda.h>
#include <pthread.h>
#include <unistd.h>

/* The driver API through the runtime (no link against libcuda, so the test
 * loads, and skips, on a machine without a driver). */
static CUresult (*p_cuCtxGetCurrent)(CUcontext *);
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuDevicePrimaryCtxGetState)(CUdevice, unsigned int *, int *);
#define cuCtxGetCurrent p_cuCtxGetCurrent
#define cuDeviceGet p_cuDeviceGet
#define cuDevicePrimaryCtxGetState p_cuDevicePrimaryCtxGetState

static void load_driver(void) {
  enum cudaDriverEntryPointQueryResult q;
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", (void **)&p_cuCtxGetCurrent, 12000, cudaEnableDefault, &q));
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuDeviceGet", (void **)&p_cuDeviceGet, 12000, cudaEnableDefault, &q));
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", (void **)&p_cuDevicePrimaryCtxGetState, 12000,
                                           cudaEnableDefault, &q));
}

#define MAXD 64
static int g_n;
static gpumem_context *g_ctx;
static char smi_uuid[MAXD][64], smi_pci[MAXD][64];
static int smi_n = 0;

static int primary_active(int ordinal) {
  CUdevice d;
  unsigned int flags = 0;
  int active = -1;
  if (cuDeviceGet(&d, ordinal) != CUDA_SUCCESS) return -1;
  if (cuDevicePrimaryCtxGetState(d, &flags, &active) != CUDA_SUCCESS) return -1;
  return active;
}

static void trim_ws(char *s) {
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  char *b = s;
  while (*b && isspace((unsigned char)*b)) b++;
  memmove(s, b, strlen(b) + 1);
}

static void read_smi(void) {
  FILE *f = popen("nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader 2>/dev/null", "r");
  char line[512];
  if (!f) return;
  while (fgets(line, sizeof line, f) && smi_n < MAXD) {
    char *a = strtok(line, ","), *b = strtok(NULL, ","), *c = strtok(NULL, ",\n");
    if (!a || !b || !c) continue;
    trim_ws(a);
    trim_ws(b);
    trim_ws(c);
    int idx = atoi(a);
    if (idx < 0 || idx >= MAXD) continue;
    snprintf(smi_uuid[idx], sizeof smi_uuid[idx], "%s", b);
    /* "00000000:17:00.0" -> "0000:17:00.0", lower case */
    const char *p = c;
    const char *colon = strchr(c, ':');
    if (colon && colon - c > 4) p = colon - 4;
    snprintf(smi_pci[idx], sizeof smi_pci[idx], "%s", p);
    for (char *q = smi_pci[idx]; *q; q++) *q = (char)tolower((unsigned char)*q);
    if (idx + 1 > smi_n) smi_n = idx + 1;
  }
  pclose(f);
}

/* UUIDs of the GPUs on which nvidia-smi lists this process; returns the count, -1 if nvidia-smi failed. */
static int smi_my_gpus(char out[][64], int max) {
  char cmd[128], line[512];
  int k = 0;
  FILE *f = popen("nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>/dev/null", "r");
  if (!f) return -1;
  snprintf(cmd, sizeof cmd, "%d", (int)getpid());
  while (fgets(line, sizeof line, f)) {
    char *a = strtok(line, ","), *b = strtok(NULL, ",\n");
    if (!a || !b) continue;
    trim_ws(a);
    trim_ws(b);
    if (strcmp(a, cmd) == 0 && k < max) snprintf(out[k++], 64, "%s", b);
  }
  return pclose(f) == 0 ? k : -1;
}

static void *t_use_last_only(void *arg) {
  int last = g_n - 1;
  CUcontext cur = (CUcontext)0x1;
  gpumem_device_info info;
  void *p = NULL;
  (void)arg;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_ST(gpumem_device_get_info(g_ctx, last, &info), GPUMEM_OK);
  CHECK_ST(gpumem_alloc(g_ctx, last, 64 * MIB, NULL, &p), GPUMEM_OK);
  CHECK_ST(gpumem_free(g_ctx, p, NULL), GPUMEM_OK);
  CHECK(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == NULL); /* the thread has no context, as before */
  printf("thread using only device %d: afterwards current context %p\n", last, (void *)cur);
  return NULL;
}

static void *t_current_kept(void *arg) {
  int last = g_n - 1, dev = -1;
  CUcontext before = NULL, after = NULL;
  void *p = NULL;
  gpumem_device_info info;
  uint64_t rel = 0;
  (void)arg;
  CUDA_OK(cudaSetDevice(last));
  CUDA_OK(cudaFree(0));
  CHECK(cuCtxGetCurrent(&before) == CUDA_SUCCESS && before != NULL);
  CHECK_ST(gpumem_alloc(g_ctx, 0, 64 * MIB, NULL, &p), GPUMEM_OK);
  CHECK_ST(gpumem_free(g_ctx, p, NULL), GPUMEM_OK);
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_ST(gpumem_device_get_info(g_ctx, 0, &info), GPUMEM_OK);
  CHECK_ST(gpumem_trim(g_ctx, 0, 0, &rel), GPUMEM_OK);
  CUDA_OK(cudaGetDevice(&dev));
  CHECK(cuCtxGetCurrent(&after) == CUDA_SUCCESS);
  printf("thread with device %d current, pool used on device 0: current device now %d, context %s\n", last, dev,
         after == before ? "unchanged" : "CHANGED");
  CHECK(dev == last);
  CHECK(after == before);
  return NULL;
}

static void per_device_pools(void) {
  void *p[MAXD];
  uint64_t rel = 0;
  int d;
  for (d = 0; d < g_n; d++) {
    CHECK_ST(gpumem_alloc(g_ctx, d, GIB, NULL, &p[d]), GPUMEM_OK);
    CUDA_OK(cudaSetDevice(d));
    fill(p[d], GIB, (uint32_t)(d + 40), 0);
    CHECK(check(p[d], GIB, (uint32_t)(d + 40), 0) == 0);
  }
  for (d = 0; d < g_n; d++) CHECK_ST(gpumem_free(g_ctx, p[d], NULL), GPUMEM_OK);
  for (d = 0; d < g_n; d++) CHECK(stats_of(g_ctx, d).cached_bytes >= GIB);
  if (g_n >= 2) {
    CHECK_ST(gpumem_trim(g_ctx, 1, 0, &rel), GPUMEM_OK);
    CHECK(stats_of(g_ctx, 1).cached_bytes == 0);
    CHECK(stats_of(g_ctx, 0).cached_bytes >= GIB);
    CHECK_ST(gpumem_alloc(g_ctx, 1, GIB, NULL, &p[1]), GPUMEM_OK);
    CHECK_ST(gpumem_reset(g_ctx, 0, 0), GPUMEM_OK);
    CHECK(stats_of(g_ctx, 0).reserved_bytes == 0);
    CHECK(stats_of(g_ctx, 1).num_live == 1);
    CHECK_ST(gpumem_free(g_ctx, p[1], NULL), GPUMEM_OK); /* device 1's block survived the reset of device 0 */
    printf("per-device pools: trim(1) and reset(0) each touched only their device\n");
  }
  CHECK_ST(gpumem_trim(g_ctx, GPUMEM_ALL_DEVICES, 0, &rel), GPUMEM_OK);
  for (d = 0; d < g_n; d++) CHECK(stats_of(g_ctx, d).reserved_bytes == 0);
  CHECK_ST(gpumem_reset(g_ctx, GPUMEM_ALL_DEVICES, 0), GPUMEM_OK);
}

static void identities(void) {
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  const char *order = getenv("CUDA_DEVICE_ORDER");
  int list[MAXD], nlist = 0, numeric = cvd != NULL;
  if (cvd) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", cvd);
    for (char *t = strtok(buf, ","); t && nlist < MAXD; t = strtok(NULL, ",")) {
      for (char *c = t; *c; c++)
        if (!isdigit((unsigned char)*c)) numeric = 0;
      list[nlist++] = atoi(t);
    }
  }
  for (int d = 0; d < g_n; d++) {
    gpumem_device_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_ST(gpumem_device_get_info(g_ctx, d, &info), GPUMEM_OK);
    printf("visible %d: %s %s pci %s physical %d total %.3f GiB free %.3f GiB\n", d, info.name, info.uuid,
           info.pci_bus_id, info.physical_index, gib(info.total_bytes), gib(info.free_bytes));
    CHECK(info.ordinal == d);
    CHECK(info.physical_index >= 0 && info.physical_index < smi_n);
    if (info.physical_index >= 0 && info.physical_index < smi_n) {
      CHECK(strcmp(info.uuid, smi_uuid[info.physical_index]) == 0);
      CHECK(strcmp(info.pci_bus_id, smi_pci[info.physical_index]) == 0);
    }
    if (numeric && order && strcmp(order, "PCI_BUS_ID") == 0 && d < nlist) CHECK(info.physical_index == list[d]);
  }
}

int main(void) {
  require_gpu("gpu_context");
  gpumem_config cfg;
  int d, total_dev = 0;
  char mine[MAXD][64];

  load_driver();
  CUDA_OK(cudaGetDeviceCount(&total_dev));
  read_smi();
  printf("CUDA_VISIBLE_DEVICES=%s: %d visible device(s); nvidia-smi lists %d\n",
         getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)", total_dev, smi_n);
  for (d = 0; d < total_dev; d++) CHECK(primary_active(d) == 0); /* fresh process */

  gpumem_config_init(&cfg);
  g_ctx = make_ctx(&cfg);
  CHECK_ST(gpumem_device_count(g_ctx, &g_n), GPUMEM_OK);
  CHECK(g_n == total_dev);
  for (d = 0; d < g_n; d++) CHECK(primary_active(d) == 0); /* create and count touch no device */

  pthread_t t;
  pthread_create(&t, NULL, t_use_last_only, NULL);
  pthread_join(t, NULL);
  for (d = 0; d < g_n; d++) {
    int a = primary_active(d);
    printf("device %d: primary context %s\n", d, a == 1 ? "active" : a == 0 ? "none" : "?");
    CHECK(a == (d == g_n - 1 ? 1 : 0));
  }
  {
    gpumem_device_info last;
    memset(&last, 0, sizeof last);
    last.struct_size = sizeof last;
    CHECK_ST(gpumem_device_get_info(g_ctx, g_n - 1, &last), GPUMEM_OK);
    int k = smi_my_gpus(mine, MAXD);
    printf("nvidia-smi --query-compute-apps lists this process on %d GPU(s)%s", k, k > 0 ? ":" : "\n");
    for (int i = 0; i < k; i++) printf(" %s%s", mine[i], i + 1 == k ? "\n" : "");
    if (k >= 0) {
      CHECK(k == 1);
      if (k == 1) CHECK(strcmp(mine[0], last.uuid) == 0);
    }
  }

  pthread_create(&t, NULL, t_current_kept, NULL);
  pthread_join(t, NULL);
  per_device_pools();
  identities();
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_ST(gpumem_destroy(g_ctx, 0), GPUMEM_OK);
  return finish("gpu_context");
}
