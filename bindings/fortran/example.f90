! libgpumem from Fortran: a context, an allocation per time step, stats, trim.
! Build: see bindings/fortran/README.md (or the CMake target example_fortran).
! Run on the simulator: GPUMEM_BACKEND=sim ./example_fortran
program example_fortran
  use, intrinsic :: iso_c_binding
  use gpumem
  implicit none
  type(c_ptr) :: ctx, field
  type(gpumem_stats) :: stats
  integer(c_int) :: st, ndev, step
  integer(c_int64_t) :: released
  integer(c_size_t), parameter :: n = 1000000_c_size_t

  st = gpumem_create(c_null_ptr, ctx)            ! defaults; GPUMEM_* environment applies
  if (st /= GPUMEM_OK) then
     print '(2a)', "gpumem_create: ", gpumem_status_name_f(st)
     error stop 1
  end if
  st = gpumem_device_count(ctx, ndev)
  print '(3a,i0,a)', "backend ", gpumem_backend_name_f(ctx), ", ", ndev, " device(s)"

  do step = 1, 5
     field = c_null_ptr
     st = gpumem_alloc(ctx, 0, n * 8, c_null_ptr, field)   ! n doubles on device 0
     if (st /= GPUMEM_OK) then
        print '(2a)', "gpumem_alloc: ", gpumem_status_name_f(st)
        error stop 1
     end if
     ! ... launch kernels that use field ...
     st = gpumem_free(ctx, field, c_null_ptr)               ! cached for the next step
  end do

  st = gpumem_get_stats_f(ctx, 0, stats)
  print '(a,i0,a,i0,a,i0)', "allocations ", stats%num_allocs, ", backend allocations ", &
       stats%num_backend_allocs, ", cached bytes ", stats%cached_bytes
  st = gpumem_trim(ctx, GPUMEM_ALL_DEVICES, 0_c_int64_t, released)
  print '(a,i0,a)', "trim gave back ", released, " bytes"
  st = gpumem_destroy(ctx, 0)
  if (st /= GPUMEM_OK) error stop 1
end program example_fortran
