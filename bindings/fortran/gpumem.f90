!> \file gpumem.f90
!> \brief Fortran 2003 binding of libgpumem (iso_c_binding).
!>
!> Two layers:
!>  - the C functions themselves, under their C names (gpumem_create,
!>    gpumem_alloc, ...), with bind(c) types matching gpumem_config,
!>    gpumem_stats and gpumem_device_info;
!>  - a few conveniences for Fortran callers, named *_f: gpumem_create_f
!>    (optional config and backend name as a Fortran string),
!>    gpumem_get_stats_f, gpumem_device_info_f (strings as Fortran strings),
!>    gpumem_status_name_f, gpumem_strerror_f, gpumem_backend_name_f.
!>
!> Unsigned C integers are mapped to the signed Fortran kinds of the same
!> size (uint64_t -> integer(c_int64_t)); GPUMEM_UNLIMITED is -1 there.
!> Device pointers are type(c_ptr); on the sim backend they are host memory
!> and can be viewed with c_f_pointer.
module gpumem
  use, intrinsic :: iso_c_binding
  implicit none
  private

  ! ---- status codes (gpumem_status) ----
  integer(c_int), parameter, public :: GPUMEM_OK = 0
  integer(c_int), parameter, public :: GPUMEM_ERR_INVALID_ARGUMENT = 1
  integer(c_int), parameter, public :: GPUMEM_ERR_INVALID_DEVICE = 2
  integer(c_int), parameter, public :: GPUMEM_ERR_INVALID_POINTER = 3
  integer(c_int), parameter, public :: GPUMEM_ERR_OUT_OF_MEMORY = 4
  integer(c_int), parameter, public :: GPUMEM_ERR_LIMIT_EXCEEDED = 5
  integer(c_int), parameter, public :: GPUMEM_ERR_BUSY = 6
  integer(c_int), parameter, public :: GPUMEM_ERR_NO_BACKEND = 7
  integer(c_int), parameter, public :: GPUMEM_ERR_BACKEND = 8
  integer(c_int), parameter, public :: GPUMEM_ERR_NOT_SUPPORTED = 9
  integer(c_int), parameter, public :: GPUMEM_ERR_INTERNAL = 10

  ! ---- constants ----
  integer(c_int), parameter, public :: GPUMEM_ALL_DEVICES = -1
  integer(c_int64_t), parameter, public :: GPUMEM_UNLIMITED = -1_c_int64_t  ! UINT64_MAX
  integer(c_int), parameter, public :: GPUMEM_DESTROY_FORCE = 1
  integer(c_int), parameter, public :: GPUMEM_RESET_DEVICE = 1
  integer(c_int32_t), parameter, public :: GPUMEM_CONFIG_NO_ENV = 1
  integer(c_int), parameter, public :: GPUMEM_LOG_DEBUG = 0, GPUMEM_LOG_INFO = 1, &
       GPUMEM_LOG_WARN = 2, GPUMEM_LOG_ERROR = 3, GPUMEM_LOG_OFF = 4

  !> gpumem_config. Fill with gpumem_config_init; set backend with gpumem_config_set_backend.
  type, bind(c), public :: gpumem_config
     integer(c_int32_t) :: struct_size = 0
     integer(c_int32_t) :: flags = 0
     type(c_ptr) :: backend = c_null_ptr           ! const char *
     type(c_ptr) :: custom_backend = c_null_ptr    ! const gpumem_backend *
     integer(c_int64_t) :: release_threshold = 0
     real(c_double) :: trim_free_fraction = 0
     integer(c_int64_t) :: limit_bytes = 0
     real(c_double) :: limit_fraction = 0
     integer(c_int64_t) :: initial_bytes = 0
     type(c_funptr) :: oom_callback = c_null_funptr
     type(c_ptr) :: oom_user = c_null_ptr
     type(c_funptr) :: log_callback = c_null_funptr
     type(c_ptr) :: log_user = c_null_ptr
     integer(c_int) :: log_level = 2
     integer(c_int) :: expandable = 1
     type(c_ptr) :: share = c_null_ptr             ! const char *: "user" (NULL), "off" or a group name
     integer(c_int32_t) :: share_wait_ms = 300
     integer(c_int32_t) :: watch_interval_ms = 200
     integer(c_int) :: stream_deps = 0
     real(c_double) :: peak_headroom = 0.0_c_double
     integer(c_int) :: capture_probe = 1
  end type gpumem_config

  !> gpumem_stats (struct_size is set by gpumem_get_stats_f).
  type, bind(c), public :: gpumem_stats
     integer(c_int32_t) :: struct_size = 0
     integer(c_int32_t) :: reserved_ = 0
     integer(c_int64_t) :: allocated_bytes = 0
     integer(c_int64_t) :: allocated_peak = 0
     integer(c_int64_t) :: reserved_bytes = 0
     integer(c_int64_t) :: reserved_peak = 0
     integer(c_int64_t) :: cached_bytes = 0
     integer(c_int64_t) :: num_allocs = 0
     integer(c_int64_t) :: num_frees = 0
     integer(c_int64_t) :: num_live = 0
     integer(c_int64_t) :: num_segments = 0
     integer(c_int64_t) :: num_backend_allocs = 0
     integer(c_int64_t) :: num_backend_frees = 0
     integer(c_int64_t) :: num_trims = 0
     integer(c_int64_t) :: trimmed_bytes = 0
     integer(c_int64_t) :: num_oom_retries = 0
     integer(c_int64_t) :: num_ooms = 0
     integer(c_int64_t) :: requested_bytes = 0
     integer(c_int64_t) :: num_limit_exceeded = 0
     integer(c_int64_t) :: num_share_asks = 0
     integer(c_int64_t) :: num_share_asked = 0
     integer(c_int64_t) :: share_given_bytes = 0
  end type gpumem_stats

  !> gpumem_device_info (strings are NUL-terminated C character arrays).
  type, bind(c), public :: gpumem_device_info
     integer(c_int32_t) :: struct_size = 0
     integer(c_int) :: ordinal = 0
     character(kind=c_char) :: name(256) = c_null_char
     character(kind=c_char) :: uuid(64) = c_null_char
     character(kind=c_char) :: pci_bus_id(32) = c_null_char
     integer(c_int64_t) :: total_bytes = 0
     integer(c_int64_t) :: free_bytes = 0
     integer(c_int) :: physical_index = -1
  end type gpumem_device_info

  ! ---- the C API ----
  public :: gpumem_config_init, gpumem_create, gpumem_destroy, gpumem_device_count, &
       gpumem_device_get_info, gpumem_alloc, gpumem_free, gpumem_trim, gpumem_reset, &
       gpumem_get_stats, gpumem_reset_peak_stats, gpumem_status_name, gpumem_strerror, &
       gpumem_backend_name, gpumem_ptr_info, gpumem_set_limit, gpumem_get_limit, &
       gpumem_largest_free_block, gpumem_record_stream, gpumem_scope_begin, gpumem_scope_alloc, &
       gpumem_scope_end
  ! ---- Fortran conveniences ----
  public :: gpumem_config_set_backend, gpumem_create_f, gpumem_get_stats_f, &
       gpumem_device_info_f, gpumem_status_name_f, gpumem_strerror_f, gpumem_backend_name_f, &
       gpumem_c_string

  interface
     !> void gpumem_config_init(gpumem_config *cfg)
     subroutine gpumem_config_init(cfg) bind(c, name="gpumem_config_init")
       import :: gpumem_config
       type(gpumem_config), intent(out) :: cfg
     end subroutine gpumem_config_init

     !> gpumem_status gpumem_create(const gpumem_config *cfg, gpumem_context **out)
     !> Pass c_null_ptr as cfg for defaults, or c_loc of a gpumem_config with the target attribute.
     function gpumem_create(cfg, ctx) bind(c, name="gpumem_create") result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: cfg
       type(c_ptr), intent(out) :: ctx
       integer(c_int) :: st
     end function gpumem_create

     !> gpumem_status gpumem_destroy(gpumem_context *ctx, unsigned flags)
     function gpumem_destroy(ctx, flags) bind(c, name="gpumem_destroy") result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: ctx
       integer(c_int), value :: flags
       integer(c_int) :: st
     end function gpumem_destroy

     !> gpumem_status gpumem_device_count(gpumem_context *ctx, int *count)
     function gpumem_device_count(ctx, count) bind(c, name="gpumem_device_count") result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: ctx
       integer(c_int), intent(out) :: count
       integer(c_int) :: st
     end function gpumem_device_count

     !> gpumem_status gpumem_device_get_info(gpumem_context *ctx, int device, gpumem_device_info *info)
     function gpumem_device_get_info(ctx, device, info) bind(c, name="gpumem_device_get_info") result(st)
       import :: c_ptr, c_int, gpumem_device_info
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       type(gpumem_device_info), intent(inout) :: info
       integer(c_int) :: st
     end function gpumem_device_get_info

     !> gpumem_status gpumem_alloc(gpumem_context *ctx, int device, size_t size, gpumem_stream stream, void **out_ptr)
     function gpumem_alloc(ctx, device, size, stream, ptr) bind(c, name="gpumem_alloc") result(st)
       import :: c_ptr, c_int, c_size_t
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       integer(c_size_t), value :: size
       type(c_ptr), value :: stream
       type(c_ptr), intent(inout) :: ptr
       integer(c_int) :: st
     end function gpumem_alloc

     !> gpumem_status gpumem_free(gpumem_context *ctx, void *ptr, gpumem_stream stream)
     function gpumem_free(ctx, ptr, stream) bind(c, name="gpumem_free") result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: ctx
       type(c_ptr), value :: ptr
       type(c_ptr), value :: stream
       integer(c_int) :: st
     end function gpumem_free

     !> gpumem_status gpumem_ptr_info(gpumem_context *ctx, const void *ptr, size_t *size, int *device)
     function gpumem_ptr_info(ctx, ptr, size, device) bind(c, name="gpumem_ptr_info") result(st)
       import :: c_ptr, c_int, c_size_t
       type(c_ptr), value :: ctx
       type(c_ptr), value :: ptr
       integer(c_size_t), intent(out) :: size
       integer(c_int), intent(out) :: device
       integer(c_int) :: st
     end function gpumem_ptr_info

     !> gpumem_status gpumem_record_stream(gpumem_context *ctx, void *ptr, gpumem_stream stream)
     !> The block's free also waits for `stream`'s work queued so far (PyTorch's record_stream).
     function gpumem_record_stream(ctx, ptr, stream) bind(c, name="gpumem_record_stream") result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: ctx
       type(c_ptr), value :: ptr
       type(c_ptr), value :: stream
       integer(c_int) :: st
     end function gpumem_record_stream

     !> gpumem_status gpumem_set_limit(gpumem_context *ctx, int device, uint64_t limit_bytes)
     !> Cap the bytes reserved on `device` (0 removes the cap).
     function gpumem_set_limit(ctx, device, limit_bytes) bind(c, name="gpumem_set_limit") result(st)
       import :: c_ptr, c_int, c_int64_t
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       integer(c_int64_t), value :: limit_bytes
       integer(c_int) :: st
     end function gpumem_set_limit

     !> gpumem_status gpumem_get_limit(gpumem_context *ctx, int device, uint64_t *limit_bytes)
     function gpumem_get_limit(ctx, device, limit_bytes) bind(c, name="gpumem_get_limit") result(st)
       import :: c_ptr, c_int, c_int64_t
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       integer(c_int64_t), intent(out) :: limit_bytes
       integer(c_int) :: st
     end function gpumem_get_limit

     !> gpumem_status gpumem_largest_free_block(gpumem_context *ctx, int device, uint64_t *bytes)
     function gpumem_largest_free_block(ctx, device, bytes) bind(c, name="gpumem_largest_free_block") result(st)
       import :: c_ptr, c_int, c_int64_t
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       integer(c_int64_t), intent(out) :: bytes
       integer(c_int) :: st
     end function gpumem_largest_free_block

     !> gpumem_status gpumem_scope_begin(gpumem_context *ctx, int device, gpumem_stream stream, gpumem_scope **out)
     !> A scope: everything gpumem_scope_alloc gives out is freed by gpumem_scope_end (a time step's temporaries).
     function gpumem_scope_begin(ctx, device, stream, scope) bind(c, name="gpumem_scope_begin") result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       type(c_ptr), value :: stream
       type(c_ptr), intent(out) :: scope
       integer(c_int) :: st
     end function gpumem_scope_begin

     !> gpumem_status gpumem_scope_alloc(gpumem_scope *scope, size_t size, void **out_ptr)
     function gpumem_scope_alloc(scope, size, ptr) bind(c, name="gpumem_scope_alloc") result(st)
       import :: c_ptr, c_int, c_size_t
       type(c_ptr), value :: scope
       integer(c_size_t), value :: size
       type(c_ptr), intent(inout) :: ptr
       integer(c_int) :: st
     end function gpumem_scope_alloc

     !> gpumem_status gpumem_scope_end(gpumem_scope *scope): frees everything allocated in it
     function gpumem_scope_end(scope) bind(c, name="gpumem_scope_end") result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: scope
       integer(c_int) :: st
     end function gpumem_scope_end

     !> gpumem_status gpumem_trim(gpumem_context *ctx, int device, uint64_t keep_bytes, uint64_t *released)
     function gpumem_trim(ctx, device, keep_bytes, released) bind(c, name="gpumem_trim") result(st)
       import :: c_ptr, c_int, c_int64_t
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       integer(c_int64_t), value :: keep_bytes
       integer(c_int64_t), intent(out) :: released
       integer(c_int) :: st
     end function gpumem_trim

     !> gpumem_status gpumem_reset(gpumem_context *ctx, int device, unsigned flags)
     function gpumem_reset(ctx, device, flags) bind(c, name="gpumem_reset") result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       integer(c_int), value :: flags
       integer(c_int) :: st
     end function gpumem_reset

     !> gpumem_status gpumem_get_stats(gpumem_context *ctx, int device, gpumem_stats *out)
     !> Set stats%struct_size = 0 (current size) or use gpumem_get_stats_f.
     function gpumem_get_stats(ctx, device, stats) bind(c, name="gpumem_get_stats") result(st)
       import :: c_ptr, c_int, gpumem_stats
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       type(gpumem_stats), intent(inout) :: stats
       integer(c_int) :: st
     end function gpumem_get_stats

     !> gpumem_status gpumem_reset_peak_stats(gpumem_context *ctx, int device)
     function gpumem_reset_peak_stats(ctx, device) bind(c, name="gpumem_reset_peak_stats") result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: ctx
       integer(c_int), value :: device
       integer(c_int) :: st
     end function gpumem_reset_peak_stats

     !> const char *gpumem_status_name(gpumem_status s)
     function gpumem_status_name(s) bind(c, name="gpumem_status_name") result(p)
       import :: c_ptr, c_int
       integer(c_int), value :: s
       type(c_ptr) :: p
     end function gpumem_status_name

     !> const char *gpumem_strerror(gpumem_status s)
     function gpumem_strerror(s) bind(c, name="gpumem_strerror") result(p)
       import :: c_ptr, c_int
       integer(c_int), value :: s
       type(c_ptr) :: p
     end function gpumem_strerror

     !> const char *gpumem_backend_name(const gpumem_context *ctx)
     function gpumem_backend_name(ctx) bind(c, name="gpumem_backend_name") result(p)
       import :: c_ptr
       type(c_ptr), value :: ctx
       type(c_ptr) :: p
     end function gpumem_backend_name

     function c_strlen(s) bind(c, name="strlen") result(n)
       import :: c_ptr, c_size_t
       type(c_ptr), value :: s
       integer(c_size_t) :: n
     end function c_strlen
  end interface

  !> Backend names passed to gpumem_create must stay valid during the call;
  !> gpumem_config_set_backend keeps a copy here (one per program, not thread-safe).
  character(kind=c_char, len=64), target, save :: backend_storage = c_null_char

contains

  !> A NUL-terminated C string (as a Fortran string) from a Fortran string.
  pure function gpumem_c_string(s) result(c)
    character(len=*), intent(in) :: s
    character(kind=c_char, len=len_trim(s) + 1) :: c
    c = trim(s) // c_null_char
  end function gpumem_c_string

  !> Copy a C string (const char *) into a Fortran string; "" for NULL.
  function f_string(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: n, i
    if (.not. c_associated(p)) then
       s = ""
       return
    end if
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: s)
    do i = 1, n
       s(i:i) = chars(i)
    end do
  end function f_string

  !> Fortran string from a NUL-terminated character array (a field of gpumem_device_info).
  function f_string_array(a) result(s)
    character(kind=c_char), intent(in) :: a(:)
    character(len=:), allocatable :: s
    integer :: n, i
    n = 0
    do i = 1, size(a)
       if (a(i) == c_null_char) exit
       n = i
    end do
    allocate(character(len=n) :: s)
    do i = 1, n
       s(i:i) = a(i)
    end do
  end function f_string_array

  !> Set cfg%backend to a name ("auto", "cuda", "hip", "sim"); the string is kept
  !> in module storage until the next call. Not thread-safe.
  subroutine gpumem_config_set_backend(cfg, name)
    type(gpumem_config), intent(inout) :: cfg
    character(len=*), intent(in) :: name
    backend_storage = trim(name) // c_null_char
    cfg%backend = c_loc(backend_storage)
  end subroutine gpumem_config_set_backend

  !> Create a context. Without cfg: defaults; with backend: that backend
  !> (overriding cfg%backend). Returns a gpumem status.
  function gpumem_create_f(ctx, cfg, backend) result(st)
    type(c_ptr), intent(out) :: ctx
    type(gpumem_config), intent(in), optional :: cfg
    character(len=*), intent(in), optional :: backend
    integer(c_int) :: st
    type(gpumem_config), target :: c
    if (present(cfg)) then
       c = cfg
    else
       call gpumem_config_init(c)
    end if
    if (present(backend)) call gpumem_config_set_backend(c, backend)
    ctx = c_null_ptr
    st = gpumem_create(c_loc(c), ctx)
  end function gpumem_create_f

  !> Statistics of one device or GPUMEM_ALL_DEVICES (sets struct_size).
  function gpumem_get_stats_f(ctx, device, stats) result(st)
    type(c_ptr), intent(in) :: ctx
    integer(c_int), intent(in) :: device
    type(gpumem_stats), intent(out) :: stats
    integer(c_int) :: st
    stats%struct_size = int(c_sizeof(stats), c_int32_t)
    st = gpumem_get_stats(ctx, device, stats)
  end function gpumem_get_stats_f

  !> Device information with its strings as Fortran strings.
  function gpumem_device_info_f(ctx, device, info, name, uuid, pci_bus_id) result(st)
    type(c_ptr), intent(in) :: ctx
    integer(c_int), intent(in) :: device
    type(gpumem_device_info), intent(out) :: info
    character(len=:), allocatable, intent(out), optional :: name, uuid, pci_bus_id
    integer(c_int) :: st
    info%struct_size = int(c_sizeof(info), c_int32_t)
    st = gpumem_device_get_info(ctx, device, info)
    if (present(name)) name = f_string_array(info%name)
    if (present(uuid)) uuid = f_string_array(info%uuid)
    if (present(pci_bus_id)) pci_bus_id = f_string_array(info%pci_bus_id)
  end function gpumem_device_info_f

  !> "GPUMEM_ERR_OUT_OF_MEMORY" etc. as a Fortran string.
  function gpumem_status_name_f(s) result(name)
    integer(c_int), intent(in) :: s
    character(len=:), allocatable :: name
    name = f_string(gpumem_status_name(s))
  end function gpumem_status_name_f

  !> A sentence describing a status, as a Fortran string.
  function gpumem_strerror_f(s) result(msg)
    integer(c_int), intent(in) :: s
    character(len=:), allocatable :: msg
    msg = f_string(gpumem_strerror(s))
  end function gpumem_strerror_f

  !> The backend's name ("cuda", "hip", "sim", ...) as a Fortran string.
  function gpumem_backend_name_f(ctx) result(name)
    type(c_ptr), intent(in) :: ctx
    character(len=:), allocatable :: name
    name = f_string(gpumem_backend_name(ctx))
  end function gpumem_backend_name_f

end module gpumem
