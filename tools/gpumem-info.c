/*
 * gpumem-info: the backend, each visible device (ordinal, physical index,
 * UUID, PCI bus id, total and free memory), CUDA_VISIBLE_DEVICES and its
 * mapping, and the processes that hold GPU device files open (like
 * `fuser -v /dev/nvidia*`: /dev/nvidia*, /dev/kfd, /dev/dri/renderD*).
 *
 *   gpumem-info [--backend NAME] [--json] [--trim [--device N | --uuid GPU-...]] [--wait MS]
 *
 * Shared GPUs: each device's members of the user's shared groups (pid, command, group,
 * reserved, cached, live bytes, whether its thread answers). --trim asks every member on every
 * device (or only on --device N / --uuid GPU-...) to give its cached memory back now, waits for the
 * answers (--wait, default 2000 ms) and prints what came back.
 *
 * Getting a device's free memory on CUDA creates the runtime's context on
 * that device (as nvidia-smi's own queries do not); the tool touches each
 * visible device once for that and gives everything back at exit.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumem.h"
#include "tools_common.h"

typedef struct holder {
  long pid;
  char comm[64];
  char dev[256];
} holder;

static int is_gpu_device_file(const char *t) {
  return !strncmp(t, "/dev/nvidia", 11) || !strcmp(t, "/dev/kfd") || !strncmp(t, "/dev/dri/renderD", 16);
}

static int holder_cmp(const void *a, const void *b) {
  const holder *x = a, *y = b;
  if (x->pid != y->pid) return (x->pid > y->pid) - (x->pid < y->pid);
  return strcmp(x->dev, y->dev);
}

/* Scan the fd links of every /proc/PID; returns holders (deduplicated per pid and file); *unreadable counts pids whose fds could not be read. */
static holder *scan_holders(size_t *count, size_t *unreadable) {
  holder *h = NULL;
  size_t n = 0, cap = 0;
  *unreadable = 0;
  DIR *proc = opendir("/proc");
  if (!proc) {
    *count = 0;
    return NULL;
  }
  struct dirent *pe;
  while ((pe = readdir(proc))) {
    char *end;
    long pid = strtol(pe->d_name, &end, 10);
    if (*end || pid <= 0) continue;
    char path[300];
    snprintf(path, sizeof path, "/proc/%ld/fd", pid);
    DIR *fd = opendir(path);
    if (!fd) {
      (*unreadable)++;
      continue;
    }
    char comm[64] = "?";
    snprintf(path, sizeof path, "/proc/%ld/comm", pid);
    FILE *cf = fopen(path, "r");
    if (cf) {
      if (fgets(comm, sizeof comm, cf)) comm[strcspn(comm, "\n")] = 0;
      fclose(cf);
    }
    struct dirent *fe;
    while ((fe = readdir(fd))) {
      if (fe->d_name[0] == '.') continue;
      char link[600], target[256];
      snprintf(link, sizeof link, "/proc/%ld/fd/%s", pid, fe->d_name);
      ssize_t len = readlink(link, target, sizeof target - 1);
      if (len <= 0) continue;
      target[len] = 0;
      if (!is_gpu_device_file(target)) continue;
      int dup = 0;
      for (size_t i = 0; i < n && !dup; i++) dup = h[i].pid == pid && !strcmp(h[i].dev, target);
      if (dup) continue;
      if (n == cap) {
        size_t ncap = cap ? cap * 2 : 32;
        holder *nh = realloc(h, ncap * sizeof *nh);
        if (!nh) break;
        h = nh;
        cap = ncap;
      }
      h[n].pid = pid;
      snprintf(h[n].comm, sizeof h[n].comm, "%s", comm);
      snprintf(h[n].dev, sizeof h[n].dev, "%s", target);
      n++;
    }
    closedir(fd);
  }
  closedir(proc);
  if (n) qsort(h, n, sizeof *h, holder_cmp);
  *count = n;
  return h;
}

static void print_bytes(uint64_t b) {
  printf("%llu (%.2f GiB)", (unsigned long long)b, (double)b / (1024.0 * 1024.0 * 1024.0));
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

/* The members of a device's shared groups (*n of them, up to 256); NULL when none or not shared (*st says). */
static gpumem_share_member *share_members(gpumem_context *ctx, int d, size_t *n, gpumem_status *st) {
  static gpumem_share_member m[256];
  m[0].struct_size = sizeof m[0];
  *n = 0;
  *st = gpumem_share_members(ctx, d, m, 256, n);
  if (*n > 256) *n = 256;
  return *st == GPUMEM_OK ? m : NULL;
}

int main(int argc, char **argv) {
  const char *backend = NULL, *only_uuid = NULL;
  int json = 0, trim = 0, only_dev = -1;
  long wait_ms = 2000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
    else if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "--trim")) trim = 1;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) only_dev = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--uuid") && i + 1 < argc) only_uuid = argv[++i];
    else if (!strcmp(argv[i], "--wait") && i + 1 < argc) wait_ms = atol(argv[++i]);
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("usage: gpumem-info [--backend auto|cuda|hip|sim] [--json] [--trim [--device N | --uuid GPU-...]] "
             "[--wait MS]\n"
             "  --trim  ask every member of your shared groups on the GPU(s) to give cached memory back now\n");
      return 0;
    } else {
      fprintf(stderr, "gpumem-info: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  const char *hvd = getenv("HIP_VISIBLE_DEVICES");
  const char *rvd = getenv("ROCR_VISIBLE_DEVICES");

  gpumem_config cfg;
  gpumem_config_init(&cfg);
  cfg.backend = backend;
  gpumem_context *ctx = NULL;
  gpumem_status st = gpumem_create(&cfg, &ctx);
  int count = 0;
  gpumem_device_info *infos = NULL;
  gpumem_status *info_st = NULL;
  if (st == GPUMEM_OK && gpumem_device_count(ctx, &count) == GPUMEM_OK && count > 0) {
    infos = calloc((size_t)count, sizeof *infos);
    info_st = calloc((size_t)count, sizeof *info_st);
    if (!infos || !info_st) count = 0;
    for (int d = 0; d < count; d++) {
      infos[d].struct_size = sizeof infos[d];
      info_st[d] = gpumem_device_get_info(ctx, d, &infos[d]);
    }
  }
  if (wait_ms < 0 || wait_ms > 600000) wait_ms = 2000;
  /* --trim first, so that the listing below shows what is left */
  uint64_t *trim_given = count > 0 ? calloc((size_t)count, sizeof *trim_given) : NULL;
  size_t *trim_answered = count > 0 ? calloc((size_t)count, sizeof *trim_answered) : NULL;
  gpumem_status *trim_st = count > 0 ? calloc((size_t)count, sizeof *trim_st) : NULL;
  int *trimmed = count > 0 ? calloc((size_t)count, sizeof *trimmed) : NULL;
  if (trim && count > 0 && trim_given && trim_answered && trim_st && trimmed) {
    for (int d = 0; d < count; d++) {
      if (info_st[d] != GPUMEM_OK) continue;
      if (only_dev >= 0 && d != only_dev) continue;
      if (only_uuid != NULL && strncmp(infos[d].uuid, only_uuid, strlen(only_uuid)) != 0) continue;
      trimmed[d] = 1;
      trim_st[d] = gpumem_share_reclaim(ctx, d, GPUMEM_UNLIMITED, (uint32_t)wait_ms, &trim_given[d], &trim_answered[d]);
      (void)gpumem_device_get_info(ctx, d, &infos[d]); /* free memory after */
    }
  }
  size_t nh = 0, unreadable = 0;
  holder *h = scan_holders(&nh, &unreadable);
  const char *bname = st == GPUMEM_OK ? gpumem_backend_name(ctx) : (backend ? backend : "auto");

  if (json) {
    printf("{\n  \"backend\": ");
    tools_json_string(stdout, bname);
    printf(",\n  \"status\": \"%s\",\n  \"CUDA_VISIBLE_DEVICES\": ", gpumem_status_name(st));
    if (cvd) tools_json_string(stdout, cvd); else printf("null");
    printf(",\n  \"HIP_VISIBLE_DEVICES\": ");
    if (hvd) tools_json_string(stdout, hvd); else printf("null");
    printf(",\n  \"ROCR_VISIBLE_DEVICES\": ");
    if (rvd) tools_json_string(stdout, rvd); else printf("null");
    printf(",\n  \"devices\": [");
    for (int d = 0; d < count; d++) {
      const gpumem_device_info *i = &infos[d];
      printf("%s\n    {\"ordinal\": %d, \"status\": \"%s\"", d ? "," : "", d, gpumem_status_name(info_st[d]));
      if (info_st[d] == GPUMEM_OK) {
        printf(", \"physical_index\": %d, \"name\": ", i->physical_index);
        tools_json_string(stdout, i->name);
        printf(", \"uuid\": ");
        tools_json_string(stdout, i->uuid);
        printf(", \"pci_bus_id\": ");
        tools_json_string(stdout, i->pci_bus_id);
        printf(", \"total_bytes\": %llu, \"free_bytes\": %llu", (unsigned long long)i->total_bytes,
               (unsigned long long)i->free_bytes);
        size_t nm = 0;
        gpumem_status ms;
        gpumem_share_member *m = share_members(ctx, d, &nm, &ms);
        printf(", \"share_status\": \"%s\", \"share_members\": [", gpumem_status_name(ms));
        for (size_t k = 0; m != NULL && k < nm; k++) {
          printf("%s{\"pid\": %d, \"command\": ", k ? ", " : "", m[k].pid);
          tools_json_string(stdout, m[k].command);
          printf(", \"group\": ");
          tools_json_string(stdout, m[k].group);
          printf(", \"reserved_bytes\": %llu, \"cached_bytes\": %llu, \"live_bytes\": %llu, \"asked\": %llu, "
                 "\"was_asked\": %llu, \"given_bytes\": %llu, \"listening\": %s, \"self\": %s}",
                 (unsigned long long)m[k].reserved_bytes, (unsigned long long)m[k].cached_bytes,
                 (unsigned long long)m[k].live_bytes, (unsigned long long)m[k].asked,
                 (unsigned long long)m[k].was_asked, (unsigned long long)m[k].given_bytes,
                 m[k].listening ? "true" : "false", m[k].self ? "true" : "false");
        }
        printf("]");
        if (trimmed != NULL && trimmed[d])
          printf(", \"trim\": {\"status\": \"%s\", \"given_bytes\": %llu, \"answered\": %zu}",
                 gpumem_status_name(trim_st[d]), (unsigned long long)trim_given[d], trim_answered[d]);
      }
      printf("}");
    }
    printf("%s],\n  \"device_file_holders\": [", count ? "\n  " : "");
    for (size_t k = 0; k < nh; k++) {
      printf("%s\n    {\"pid\": %ld, \"command\": ", k ? "," : "", h[k].pid);
      tools_json_string(stdout, h[k].comm);
      printf(", \"device_file\": ");
      tools_json_string(stdout, h[k].dev);
      printf(", \"self\": %s}", h[k].pid == (long)getpid() ? "true" : "false");
    }
    printf("%s],\n  \"unreadable_processes\": %zu\n}\n", nh ? "\n  " : "", unreadable);
  } else {
    printf("backend: %s", bname);
    if (st != GPUMEM_OK) printf(" (gpumem_create: %s: %s)", gpumem_status_name(st), gpumem_strerror(st));
    printf("\nCUDA_VISIBLE_DEVICES: %s\n", cvd ? (*cvd ? cvd : "(empty: no device)") : "(unset: all devices)");
    if (hvd) printf("HIP_VISIBLE_DEVICES: %s\n", hvd);
    if (rvd) printf("ROCR_VISIBLE_DEVICES: %s\n", rvd);
    printf("visible devices: %d\n", count);
    for (int d = 0; d < count; d++) {
      const gpumem_device_info *i = &infos[d];
      if (info_st[d] != GPUMEM_OK) {
        printf("  [%d] %s\n", d, gpumem_status_name(info_st[d]));
        continue;
      }
      printf("  [%d] -> physical %d  %s\n", d, i->physical_index, i->name);
      printf("      uuid %s  pci %s\n", i->uuid, i->pci_bus_id);
      printf("      total ");
      print_bytes(i->total_bytes);
      printf("  free ");
      print_bytes(i->free_bytes);
      printf("\n");
      if (trimmed != NULL && trimmed[d]) {
        if (trim_st[d] == GPUMEM_OK)
          printf("      trim: %zu member(s) answered, %.2f GiB given back\n", trim_answered[d], gib(trim_given[d]));
        else
          printf("      trim: %s\n", gpumem_status_name(trim_st[d]));
      }
      size_t nm = 0;
      gpumem_status ms;
      gpumem_share_member *m = share_members(ctx, d, &nm, &ms);
      if (ms == GPUMEM_ERR_NOT_SUPPORTED) {
        printf("      shared groups: none (this device is this process's own)\n");
      } else if (m == NULL) {
        printf("      shared groups: %s\n", gpumem_status_name(ms));
      } else {
        printf("      members of your shared groups: %zu\n", nm);
        if (nm) printf("        %8s  %-16s %-12s %12s %12s %12s  %s\n", "PID", "COMMAND", "GROUP", "RESERVED GiB",
                       "CACHED GiB", "LIVE GiB", "");
        for (size_t k = 0; k < nm; k++)
          printf("        %8d  %-16s %-12s %12.2f %12.2f %12.2f  %s%s\n", m[k].pid, m[k].command, m[k].group,
                 gib(m[k].reserved_bytes), gib(m[k].cached_bytes), gib(m[k].live_bytes),
                 m[k].listening ? "answers" : "no cache", m[k].self ? " (this process)" : "");
      }
    }
    if (count) {
      printf("mapping (visible ordinal -> physical index):");
      for (int d = 0; d < count; d++) printf(" %d->%d", d, info_st[d] == GPUMEM_OK ? infos[d].physical_index : -1);
      printf("\n");
    }
    printf("processes holding GPU device files (/dev/nvidia*, /dev/kfd, /dev/dri/renderD*): %zu\n", nh);
    if (nh) printf("  %8s  %-16s %s\n", "PID", "COMMAND", "DEVICE FILE");
    for (size_t k = 0; k < nh; k++)
      printf("  %8ld  %-16s %s%s\n", h[k].pid, h[k].comm, h[k].dev, h[k].pid == (long)getpid() ? "  (this process)" : "");
    if (unreadable) printf("  (%zu processes' file descriptors could not be read: run as root to see all)\n", unreadable);
  }
  free(h);
  free(trim_given);
  free(trim_answered);
  free(trim_st);
  free(trimmed);
  free(infos);
  free(info_st);
  if (ctx) gpumem_destroy(ctx, GPUMEM_DESTROY_FORCE);
  return st == GPUMEM_OK ? 0 : 1;
}
