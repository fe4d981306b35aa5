! Test of the Fortran binding on the sim backend (GPUMEM_SIM_DEVICES=2x1GiB,
! GPUMEM_BACKEND=sim, set by ctest). Stops with a non-zero code on the first failure.
program test_gpumem_fortran
  use, intrinsic :: iso_c_binding
  use gpumem
  implicit none

  interface
     function layout(what) bind(c, name="gpumem_ftest_layout") result(n)
       import :: c_int, c_size_t
       integer(c_int), value :: what
       integer(c_size_t) :: n
     end function layout
  end interface

  type(c_ptr) :: ctx, ctx2, p, q, r, sc, t1, t2
  type(gpumem_config), target :: cfg
  type(gpumem_stats), target :: stats, s0, s1
  type(gpumem_device_info), target :: info
  character(len=:), allocatable :: uuid, name
  integer(c_int) :: st, n, dev
  integer(c_int64_t), target :: released, lim, big
  integer(c_size_t) :: sz
  integer(c_int8_t), pointer :: bytes(:)
  integer :: checks = 0

  ! ---- struct layouts match C ----
  call check(c_sizeof(cfg) == layout(0), "sizeof(gpumem_config)")
  call check(c_sizeof(stats) == layout(1), "sizeof(gpumem_stats)")
  call check(c_sizeof(info) == layout(2), "sizeof(gpumem_device_info)")
  call check(offset(c_loc(cfg), c_loc(cfg%log_level)) == layout(3), "offsetof(config, log_level)")
  call check(offset(c_loc(stats), c_loc(stats%num_limit_exceeded)) == layout(4), "offsetof(stats, num_limit_exceeded)")
  call check(offset(c_loc(info), c_loc(info%total_bytes)) == layout(5), "offsetof(info, total_bytes)")
  call check(offset(c_loc(info), c_loc(info%physical_index)) == layout(6), "offsetof(info, physical_index)")
  call check(offset(c_loc(cfg), c_loc(cfg%initial_bytes)) == layout(7), "offsetof(config, initial_bytes)")
  call check(offset(c_loc(cfg), c_loc(cfg%peak_headroom)) == layout(8), "offsetof(config, peak_headroom)")
  call check(offset(c_loc(cfg), c_loc(cfg%capture_probe)) == layout(9), "offsetof(config, capture_probe)")

  ! ---- status names ----
  call check(gpumem_status_name_f(GPUMEM_OK) == "GPUMEM_OK", "status name OK")
  call check(gpumem_status_name_f(GPUMEM_ERR_OUT_OF_MEMORY) == "GPUMEM_ERR_OUT_OF_MEMORY", "status name OOM")
  call check(len(gpumem_strerror_f(GPUMEM_ERR_BUSY)) > 10, "strerror")

  ! ---- config defaults ----
  call gpumem_config_init(cfg)
  call check(cfg%struct_size == int(c_sizeof(cfg), c_int32_t), "config struct_size")
  call check(cfg%release_threshold == GPUMEM_UNLIMITED, "default release_threshold")
  call check(abs(cfg%trim_free_fraction - 0.10d0) < 1d-12, "default trim_free_fraction")
  call check(cfg%limit_bytes == 0 .and. cfg%initial_bytes == 0, "default limits")
  call check(cfg%log_level == GPUMEM_LOG_WARN, "default log level")

  ! ---- create with a NULL config (environment: GPUMEM_BACKEND=sim) ----
  st = gpumem_create(c_null_ptr, ctx)
  call expect(st, GPUMEM_OK, "create(NULL)")
  call check(gpumem_backend_name_f(ctx) == "sim", "backend is sim")
  call expect(gpumem_device_count(ctx, n), GPUMEM_OK, "device_count")
  call check(n == 2, "two simulated devices")
  call expect(gpumem_device_info_f(ctx, 1, info, name=name, uuid=uuid), GPUMEM_OK, "device_info")
  call check(info%ordinal == 1, "info ordinal")
  call check(uuid(1:4) == "GPU-" .and. len(uuid) == 40, "uuid form")
  call check(len(name) > 0, "device name")
  call check(info%total_bytes == 1073741824_c_int64_t, "total bytes 1 GiB")
  call expect(gpumem_device_info_f(ctx, 2, info), GPUMEM_ERR_INVALID_DEVICE, "device_info(2)")

  ! ---- alloc, use, free ----
  p = c_null_ptr
  call expect(gpumem_alloc(ctx, 0, 4096_c_size_t, c_null_ptr, p), GPUMEM_OK, "alloc dev 0")
  call check(c_associated(p), "pointer")
  call check(mod(transfer(p, 0_c_intptr_t), 256_c_intptr_t) == 0, "256-byte alignment")
  call c_f_pointer(p, bytes, [4096])   ! sim memory is host memory
  bytes = 7_c_int8_t
  call check(all(bytes == 7_c_int8_t), "write and read back")
  call expect(gpumem_ptr_info(ctx, p, sz, dev), GPUMEM_OK, "ptr_info")
  call check(sz == 4096 .and. dev == 0, "ptr_info size and device")
  q = c_null_ptr
  call expect(gpumem_alloc(ctx, 1, 3000000_c_size_t, c_null_ptr, q), GPUMEM_OK, "alloc dev 1")
  r = c_null_ptr
  call expect(gpumem_alloc(ctx, 0, 0_c_size_t, c_null_ptr, r), GPUMEM_OK, "alloc 0 bytes")
  call check(.not. c_associated(r), "0 bytes gives NULL")
  call expect(gpumem_alloc(ctx, 5, 64_c_size_t, c_null_ptr, r), GPUMEM_ERR_INVALID_DEVICE, "alloc dev 5")
  call check(.not. c_associated(r), "out pointer untouched on failure")

  ! ---- stats: per device and summed ----
  call expect(gpumem_get_stats_f(ctx, 0, s0), GPUMEM_OK, "stats 0")
  call expect(gpumem_get_stats_f(ctx, 1, s1), GPUMEM_OK, "stats 1")
  call expect(gpumem_get_stats_f(ctx, GPUMEM_ALL_DEVICES, stats), GPUMEM_OK, "stats all")
  call check(s0%num_live == 1 .and. s1%num_live == 1 .and. stats%num_live == 2, "num_live")
  call check(stats%allocated_bytes == s0%allocated_bytes + s1%allocated_bytes, "allocated sum")
  call check(s1%allocated_bytes >= 3000000, "allocated dev 1")
  call check(stats%requested_bytes == 3004096, "requested bytes")
  call check(stats%reserved_bytes >= stats%allocated_bytes, "reserved >= allocated")

  ! ---- destroy with live allocations is BUSY ----
  call expect(gpumem_destroy(ctx, 0), GPUMEM_ERR_BUSY, "destroy busy")

  ! ---- free, double free ----
  call expect(gpumem_free(ctx, p, c_null_ptr), GPUMEM_OK, "free p")
  call expect(gpumem_free(ctx, p, c_null_ptr), GPUMEM_ERR_INVALID_POINTER, "double free")
  call expect(gpumem_free(ctx, c_null_ptr, c_null_ptr), GPUMEM_OK, "free NULL")

  ! ---- trim gives the cached memory of device 0 back ----
  call expect(gpumem_get_stats_f(ctx, 0, s0), GPUMEM_OK, "stats 0 after free")
  call check(s0%num_live == 0 .and. s0%cached_bytes == s0%reserved_bytes, "all cached")
  call expect(gpumem_trim(ctx, 0, 0_c_int64_t, released), GPUMEM_OK, "trim 0")
  call check(released == s0%reserved_bytes .and. released > 0, "trim released the cache")
  call expect(gpumem_get_stats_f(ctx, 0, s0), GPUMEM_OK, "stats 0 after trim")
  call check(s0%reserved_bytes == 0 .and. s0%num_trims >= 1, "device 0 empty")
  call expect(gpumem_trim(ctx, 7, 0_c_int64_t, released), GPUMEM_ERR_INVALID_DEVICE, "trim dev 7")

  ! ---- reset invalidates live allocations ----
  call expect(gpumem_reset(ctx, 1, 0), GPUMEM_OK, "reset 1")
  call expect(gpumem_get_stats_f(ctx, 1, s1), GPUMEM_OK, "stats 1 after reset")
  call check(s1%num_live == 0 .and. s1%reserved_bytes == 0, "device 1 empty after reset")
  call expect(gpumem_free(ctx, q, c_null_ptr), GPUMEM_ERR_INVALID_POINTER, "free after reset")
  call expect(gpumem_reset(ctx, 0, GPUMEM_RESET_DEVICE), GPUMEM_OK, "reset with device reset (simulated)")
  call expect(gpumem_get_stats_f(ctx, GPUMEM_ALL_DEVICES, stats), GPUMEM_OK, "stats after device reset")
  call check(stats%num_live == 0 .and. stats%reserved_bytes == 0, "nothing left after resets")
  call expect(gpumem_reset_peak_stats(ctx, GPUMEM_ALL_DEVICES), GPUMEM_OK, "reset peaks")

  call expect(gpumem_destroy(ctx, 0), GPUMEM_OK, "destroy")

  ! ---- a config from defaults with a limit, backend named from Fortran ----
  call gpumem_config_init(cfg)
  cfg%flags = GPUMEM_CONFIG_NO_ENV
  cfg%limit_bytes = 64_c_int64_t * 1024 * 1024
  call expect(gpumem_create_f(ctx2, cfg, backend="sim"), GPUMEM_OK, "create_f with config")
  p = c_null_ptr
  call expect(gpumem_alloc(ctx2, 0, 128_c_size_t * 1024 * 1024, c_null_ptr, p), GPUMEM_ERR_LIMIT_EXCEEDED, "limit")
  call expect(gpumem_alloc(ctx2, 0, 1024_c_size_t, c_null_ptr, p), GPUMEM_OK, "alloc under limit")
  ! the cap reads back, can be changed and removed; the largest cached block
  call expect(gpumem_get_limit(ctx2, 0, lim), GPUMEM_OK, "get_limit")
  call check(lim == 64_c_int64_t * 1024 * 1024, "limit from the config")
  call expect(gpumem_set_limit(ctx2, 0, 0_c_int64_t), GPUMEM_OK, "set_limit 0")
  call expect(gpumem_get_limit(ctx2, 0, lim), GPUMEM_OK, "get_limit after")
  call check(lim == 0, "no cap")
  q = c_null_ptr
  call expect(gpumem_alloc(ctx2, 0, 128_c_size_t * 1024 * 1024, c_null_ptr, q), GPUMEM_OK, "alloc past the old cap")
  call expect(gpumem_free(ctx2, q, c_null_ptr), GPUMEM_OK, "free it")
  call expect(gpumem_largest_free_block(ctx2, 0, big), GPUMEM_OK, "largest_free_block")
  call check(big >= 128_c_int64_t * 1024 * 1024, "the freed block is cached")
  call expect(gpumem_set_limit(ctx2, 7, 0_c_int64_t), GPUMEM_ERR_INVALID_DEVICE, "set_limit dev 7")
  call expect(gpumem_largest_free_block(ctx2, 7, big), GPUMEM_ERR_INVALID_DEVICE, "largest_free_block dev 7")
  ! record_stream: noted on another stream, then freed
  call expect(gpumem_record_stream(ctx2, p, transfer(int(z'5100', c_intptr_t), c_null_ptr)), GPUMEM_OK, "record_stream")
  call expect(gpumem_record_stream(ctx2, c_loc(released), c_null_ptr), GPUMEM_ERR_INVALID_POINTER, &
       "record_stream of a foreign pointer")
  call expect(gpumem_free(ctx2, p, c_null_ptr), GPUMEM_OK, "free the noted block")
  ! a scope: a time step's temporaries, freed together
  call expect(gpumem_get_stats_f(ctx2, 0, s0), GPUMEM_OK, "stats before the scope")
  call expect(gpumem_scope_begin(ctx2, 0, c_null_ptr, sc), GPUMEM_OK, "scope_begin")
  t1 = c_null_ptr
  t2 = c_null_ptr
  call expect(gpumem_scope_alloc(sc, 8192_c_size_t, t1), GPUMEM_OK, "scope_alloc 1")
  call expect(gpumem_scope_alloc(sc, 3000000_c_size_t, t2), GPUMEM_OK, "scope_alloc 2")
  call check(c_associated(t1) .and. c_associated(t2), "scope pointers")
  call expect(gpumem_get_stats_f(ctx2, 0, s1), GPUMEM_OK, "stats in the scope")
  call check(s1%num_live == s0%num_live + 2, "two live in the scope")
  call expect(gpumem_scope_end(sc), GPUMEM_OK, "scope_end")
  call expect(gpumem_get_stats_f(ctx2, 0, s1), GPUMEM_OK, "stats after the scope")
  call check(s1%num_live == s0%num_live, "the scope freed its blocks")
  call expect(gpumem_scope_begin(ctx2, 9, c_null_ptr, sc), GPUMEM_ERR_INVALID_DEVICE, "scope_begin dev 9")
  call expect(gpumem_destroy(ctx2, 0), GPUMEM_OK, "destroy after the scope")
  call gpumem_config_init(cfg)
  cfg%flags = GPUMEM_CONFIG_NO_ENV   ! else GPUMEM_BACKEND=sim from the environment wins
  call expect(gpumem_create_f(ctx2, cfg, backend="no-such-backend"), GPUMEM_ERR_NO_BACKEND, "unknown backend")
  ! without a config: defaults plus the environment (GPUMEM_BACKEND=sim)
  call expect(gpumem_create_f(ctx2), GPUMEM_OK, "create_f with defaults")
  call check(gpumem_backend_name_f(ctx2) == "sim", "environment picks sim")
  call expect(gpumem_destroy(ctx2, 0), GPUMEM_OK, "destroy defaults")

  deallocate(name, uuid)   ! main-program allocatables are not freed at exit (LeakSanitizer)
  print '(a,i0,a)', "all ", checks, " Fortran binding checks passed"

contains

  subroutine check(cond, what)
    logical, intent(in) :: cond
    character(len=*), intent(in) :: what
    checks = checks + 1
    if (.not. cond) then
       print '(a,a)', "FAILED: ", what
       error stop 1
    end if
  end subroutine check

  subroutine expect(got, want, what)
    integer(c_int), intent(in) :: got, want
    character(len=*), intent(in) :: what
    if (got /= want) then
       print '(a,a,a,a,a,a)', "FAILED: ", what, ": got ", gpumem_status_name_f(got), ", want ", &
            gpumem_status_name_f(want)
    end if
    call check(got == want, what)
  end subroutine expect

  function offset(base, member) result(off)
    type(c_ptr), intent(in) :: base, member
    integer(c_size_t) :: off
    off = int(transfer(member, 0_c_intptr_t) - transfer(base, 0_c_intptr_t), c_size_t)
  end function offset

end program test_gpumem_fortran
