//! `kernels/*.cu`, embedded in the binary, compiled with NVRTC once per process and loaded into
//! the device's primary context.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::reference::RawSample;
use super::{GpuError, driver};
use crate::cube::Interleave;

const PREPROCESS_CU: &str = include_str!("../../kernels/preprocess.cu");
const ARGMAX_CU: &str = include_str!("../../kernels/argmax.cu");

/// The PTX of `preprocess.cu` and `argmax.cu`, or the file that failed and NVRTC's log.
type Compiled = Result<(String, String), (&'static str, String)>;

/// The PTX of each source, compiled on first use (NVRTC takes tens of milliseconds a file).
static PTX: OnceLock<Compiled> = OnceLock::new();

fn ptx() -> Result<&'static (String, String), GpuError> {
    if !super::nvrtc_present() {
        return Err(GpuError::NoNvrtc);
    }
    let compiled = PTX.get_or_init(|| {
        let one = |name: &'static str, src: &str| {
            cudarc::nvrtc::compile_ptx(src)
                .map(|p| p.to_src())
                .map_err(|e| (name, e.to_string()))
        };
        Ok((one("preprocess.cu", PREPROCESS_CU)?, one("argmax.cu", ARGMAX_CU)?))
    });
    compiled.as_ref().map_err(|(kernel, message)| GpuError::Compile {
        kernel,
        message: message.clone(),
    })
}

/// A raw sample type with its preprocessing kernel.
pub trait DeviceSample: RawSample + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits {
    /// The kernel's name in `preprocess.cu`.
    const KERNEL: &'static str;
}

impl DeviceSample for i16 {
    const KERNEL: &'static str = "preprocess_i16";
}

impl DeviceSample for u16 {
    const KERNEL: &'static str = "preprocess_u16";
}

impl DeviceSample for f32 {
    const KERNEL: &'static str = "preprocess_f32";
}

/// Where a window lies in a box of the scene read for [`Kernels::preprocess_box_into`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoxShape {
    /// The box's lines, samples and bands.
    pub dims: (usize, usize, usize),
    /// The scene line and sample of the box's first value.
    pub l0: usize,
    /// See `l0`.
    pub c0: usize,
    /// The window's lines and samples.
    pub window: (usize, usize),
}

/// The loaded kernels of one device.
pub struct Kernels {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pre_i16: CudaFunction,
    pre_u16: CudaFunction,
    pre_f32: CudaFunction,
    box_i16: CudaFunction,
    box_u16: CudaFunction,
    box_f32: CudaFunction,
    gather: CudaFunction,
    argmax: CudaFunction,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels").finish_non_exhaustive()
    }
}

impl Kernels {
    /// Compiles (once per process) and loads the kernels on device `ordinal`; they run on its
    /// [`super::session_stream`].
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        if !super::driver_present() {
            return Err(GpuError::NoDriver);
        }
        let (pre, arg) = ptx()?;
        let stream = super::session_stream(ordinal)?;
        let ctx = stream.context().clone();
        let pre = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(pre.clone()))
            .map_err(driver("cuModuleLoadData preprocess"))?;
        let arg = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(arg.clone()))
            .map_err(driver("cuModuleLoadData argmax"))?;
        let f = |m: &Arc<cudarc::driver::CudaModule>, name: &'static str| {
            m.load_function(name).map_err(driver("cuModuleGetFunction"))
        };
        Ok(Self {
            pre_i16: f(&pre, "preprocess_i16")?,
            pre_u16: f(&pre, "preprocess_u16")?,
            pre_f32: f(&pre, "preprocess_f32")?,
            box_i16: f(&pre, "preprocess_box_i16")?,
            box_u16: f(&pre, "preprocess_box_u16")?,
            box_f32: f(&pre, "preprocess_box_f32")?,
            gather: f(&pre, "gather_patches")?,
            argmax: f(&arg, "argmax_confidence")?,
            ctx,
            stream,
        })
    }

    /// The context the kernels live in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream they run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// What both preprocess launches pass besides their buffers: the kernel for `T`, its integer
    /// arguments (interleave code, byte swap, lines, samples, bands) and the launch size.
    fn preprocess_setup<T: DeviceSample>(
        &self,
        interleave: Interleave,
        swap: bool,
        (lines, samples, bands): (usize, usize, usize),
    ) -> Result<(&CudaFunction, [i32; 5], u32), GpuError> {
        let bad = |message: String| GpuError::Shape {
            kernel: T::KERNEL,
            message,
        };
        let n = lines * samples * bands;
        let dim = |v: usize| i32::try_from(v).map_err(|_| bad(format!("{v} does not fit a 32-bit index")));
        let (l, s, b) = (dim(lines)?, dim(samples)?, dim(bands)?);
        let n32 = u32::try_from(n).map_err(|_| bad(format!("{n} values do not fit one launch")))?;
        let il: i32 = match interleave {
            Interleave::Bsq => 0,
            Interleave::Bil => 1,
            Interleave::Bip => 2,
        };
        let func = match T::KERNEL {
            "preprocess_i16" => &self.pre_i16,
            "preprocess_u16" => &self.pre_u16,
            _ => &self.pre_f32,
        };
        Ok((func, [il, i32::from(swap), l, s, b], n32))
    }

    /// Normalises a raw tile of `(lines, samples, bands)` into planar float32 `out`
    /// ([`super::reference::preprocess`]); `swap` when the data's byte order is not the device's.
    #[allow(clippy::too_many_arguments)]
    pub fn preprocess<T: DeviceSample>(
        &self,
        raw: &CudaSlice<T>,
        interleave: Interleave,
        swap: bool,
        (lines, samples, bands): (usize, usize, usize),
        mean: &CudaSlice<f32>,
        inv_std: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let n = lines * samples * bands;
        let bad = |message: String| GpuError::Shape {
            kernel: T::KERNEL,
            message,
        };
        if raw.len() < n || out.len() < n || mean.len() < bands || inv_std.len() < bands {
            return Err(bad(format!(
                "a {lines} x {samples} x {bands} tile needs {n} raw and output values and {bands} means and \
                 scales; got {}, {}, {} and {}",
                raw.len(),
                out.len(),
                mean.len(),
                inv_std.len()
            )));
        }
        let (func, [il, sw, l, s, b], n32) = self.preprocess_setup::<T>(interleave, swap, (lines, samples, bands))?;
        let mut launch = self.stream.launch_builder(func);
        launch
            .arg(raw)
            .arg(&il)
            .arg(&sw)
            .arg(&l)
            .arg(&s)
            .arg(&b)
            .arg(mean)
            .arg(inv_std)
            .arg(out);
        // SAFETY: the argument list matches the kernel's signature in preprocess.cu (a T pointer,
        // five ints, two float pointers, a float pointer); every buffer was checked above to hold
        // the `lines * samples * bands` values (or `bands` means and scales) the kernel indexes,
        // and threads past `n` return before touching memory.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n32)) }.map_err(driver("cuLaunchKernel preprocess"))?;
        Ok(())
    }

    /// Argmax and confidence of `scores` (`[n][k][pixels]`) into `cls` and `conf`
    /// ([`super::reference::argmax_confidence`]).
    #[allow(clippy::too_many_arguments)]
    pub fn argmax(
        &self,
        scores: &CudaSlice<f32>,
        (n, k, pixels): (usize, usize, usize),
        logits: bool,
        cls: &mut CudaSlice<u32>,
        conf: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let bad = |message: String| GpuError::Shape {
            kernel: "argmax_confidence",
            message,
        };
        let m = n * pixels;
        if k == 0 || scores.len() < m * k || cls.len() < m || conf.len() < m {
            return Err(bad(format!(
                "{n} x {k} x {pixels} scores need {} values and {m} outputs; got {}, {} and {}",
                m * k,
                scores.len(),
                cls.len(),
                conf.len()
            )));
        }
        let dim = |v: usize| i32::try_from(v).map_err(|_| bad(format!("{v} does not fit a 32-bit index")));
        let (n32, k32, p32) = (dim(n)?, dim(k)?, dim(pixels)?);
        let m32 = u32::try_from(m).map_err(|_| bad(format!("{m} pixels do not fit one launch")))?;
        let lg = i32::from(logits);
        let mut launch = self.stream.launch_builder(&self.argmax);
        launch
            .arg(scores)
            .arg(&n32)
            .arg(&k32)
            .arg(&p32)
            .arg(&lg)
            .arg(cls)
            .arg(conf);
        // SAFETY: the arguments match `argmax_confidence` in argmax.cu (a float pointer, four ints,
        // a uint pointer, a float pointer); `scores` holds n * k * pixels values and `cls`, `conf`
        // n * pixels each (checked above), and threads past n * pixels return at once.
        unsafe { launch.launch(LaunchConfig::for_num_elems(m32)) }.map_err(driver("cuLaunchKernel argmax"))?;
        Ok(())
    }

    /// [`Kernels::preprocess`] from `raw` (a tile of `T` in `interleave`) into the device memory
    /// at `out`, which need not be a [`CudaSlice`]: the input tensor ONNX Runtime bound.
    ///
    /// # Safety
    /// `out` must point to at least `lines * samples * bands` float32 values of device memory of
    /// this context, not read or written by another stream until this stream has run the kernel.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn preprocess_into<T: DeviceSample>(
        &self,
        raw: &cudarc::driver::CudaView<'_, T>,
        interleave: Interleave,
        swap: bool,
        (lines, samples, bands): (usize, usize, usize),
        mean: &CudaSlice<f32>,
        inv_std: &CudaSlice<f32>,
        out: u64,
    ) -> Result<(), GpuError> {
        let n = lines * samples * bands;
        let bad = |message: String| GpuError::Shape {
            kernel: T::KERNEL,
            message,
        };
        if raw.len() < n || mean.len() < bands || inv_std.len() < bands {
            return Err(bad(format!(
                "a {lines} x {samples} x {bands} tile needs {n} raw values and {bands} means and scales; \
                 got {}, {} and {}",
                raw.len(),
                mean.len(),
                inv_std.len()
            )));
        }
        let (func, [il, sw, l, s, b], n32) = self.preprocess_setup::<T>(interleave, swap, (lines, samples, bands))?;
        let mut launch = self.stream.launch_builder(func);
        launch
            .arg(raw)
            .arg(&il)
            .arg(&sw)
            .arg(&l)
            .arg(&s)
            .arg(&b)
            .arg(mean)
            .arg(inv_std)
            .arg(&out);
        // SAFETY: the arguments match the kernel's signature (a T pointer, five ints, two float
        // pointers, a float pointer passed as its 64-bit address); `raw`, `mean` and `inv_std`
        // were checked above, `out` holds n floats by this function's contract, and threads past
        // n return before touching memory.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n32)) }.map_err(driver("cuLaunchKernel preprocess"))?;
        Ok(())
    }

    /// [`Kernels::preprocess_into`] reading a window out of a box of the scene
    /// ([`super::reference::preprocess_box`]): `raw` holds `b.dims` (lines, samples, bands) of
    /// the file from scene line `b.l0` and sample `b.c0`; window line `y` reads scene line
    /// `lines[y]`, sample `x` scene sample `cols[x]`.
    ///
    /// # Safety
    /// `out` must point to at least `wh * ww * bands` float32 values of device memory of this
    /// context, not used by another stream until this stream has run the kernel; every
    /// `lines[y] - l0` must lie in `0..box_lines` and every `cols[x] - c0` in `0..box_samples`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn preprocess_box_into<T: DeviceSample>(
        &self,
        raw: &cudarc::driver::CudaView<'_, T>,
        interleave: Interleave,
        swap: bool,
        b: &BoxShape,
        lines: &cudarc::driver::CudaView<'_, i32>,
        cols: &cudarc::driver::CudaView<'_, i32>,
        mean: &CudaSlice<f32>,
        inv_std: &CudaSlice<f32>,
        out: u64,
    ) -> Result<(), GpuError> {
        let (bl, bs, bands) = b.dims;
        let (wh, ww) = b.window;
        let bad = |message: String| GpuError::Shape {
            kernel: T::KERNEL,
            message,
        };
        if raw.len() < bl * bs * bands
            || lines.len() < wh
            || cols.len() < ww
            || mean.len() < bands
            || inv_std.len() < bands
        {
            return Err(bad(format!(
                "a {bl} x {bs} x {bands} box read as a {wh} x {ww} window needs {} raw values, {wh} line and {ww} \
                 sample indices and {bands} means and scales; got {}, {}, {}, {} and {}",
                bl * bs * bands,
                raw.len(),
                lines.len(),
                cols.len(),
                mean.len(),
                inv_std.len()
            )));
        }
        let (_, [il, sw, l, s, nb], _) = self.preprocess_setup::<T>(interleave, swap, (bl, bs, bands))?;
        let (_, [_, _, h, w, _], n32) = self.preprocess_setup::<T>(interleave, swap, (wh, ww, bands))?;
        let dim = |v: usize| i32::try_from(v).map_err(|_| bad(format!("{v} does not fit a 32-bit index")));
        let (l0, c0) = (dim(b.l0)?, dim(b.c0)?);
        let func = match T::KERNEL {
            "preprocess_i16" => &self.box_i16,
            "preprocess_u16" => &self.box_u16,
            _ => &self.box_f32,
        };
        let mut launch = self.stream.launch_builder(func);
        launch
            .arg(raw)
            .arg(&il)
            .arg(&sw)
            .arg(&l)
            .arg(&s)
            .arg(&nb)
            .arg(lines)
            .arg(cols)
            .arg(&l0)
            .arg(&c0)
            .arg(&h)
            .arg(&w)
            .arg(mean)
            .arg(inv_std)
            .arg(&out);
        // SAFETY: the arguments match `preprocess_box_*` in preprocess.cu (a T pointer, five ints,
        // two int pointers, four ints, two float pointers, a float pointer passed as its address);
        // the buffers' lengths were checked above, the indices stay inside the box by this
        // function's contract, `out` holds the window by it too, and threads past the window's
        // values return before touching memory.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n32)) }.map_err(driver("cuLaunchKernel preprocess_box"))?;
        Ok(())
    }

    /// The `[n][bands][p][p]` patches of output pixels `first .. first + n` of a tile `tw` wide,
    /// from its planar window (`bands x wh x ww`), into the device memory at `out`
    /// ([`super::reference::gather_patches`]).
    ///
    /// # Safety
    /// `out` must point to at least `n * bands * p * p` float32 values of device memory of this
    /// context, not used by another stream until this stream has run the kernel.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather_patches_into(
        &self,
        window: &CudaSlice<f32>,
        (bands, wh, ww): (usize, usize, usize),
        p: usize,
        tw: usize,
        first: usize,
        n: usize,
        out: u64,
    ) -> Result<(), GpuError> {
        let bad = |message: String| GpuError::Shape {
            kernel: "gather_patches",
            message,
        };
        let last = first + n;
        let fits = tw > 0 && tw - 1 + p <= ww && (last == 0 || (last - 1) / tw + p <= wh);
        if window.len() < bands * wh * ww || !fits {
            return Err(bad(format!(
                "patches {first}..{last} of a tile {tw} wide at p = {p} do not lie in a {bands} x {wh} x {ww} \
                 window of {} values",
                window.len()
            )));
        }
        let total = n * bands * p * p;
        let dim = |v: usize| i32::try_from(v).map_err(|_| bad(format!("{v} does not fit a 32-bit index")));
        let args = [dim(bands)?, dim(wh)?, dim(ww)?, dim(p)?, dim(tw)?, dim(first)?, dim(n)?];
        let t32 = u32::try_from(total).map_err(|_| bad(format!("{total} values do not fit one launch")))?;
        let mut launch = self.stream.launch_builder(&self.gather);
        launch.arg(window);
        for a in &args {
            launch.arg(a);
        }
        launch.arg(&out);
        // SAFETY: the arguments match `gather_patches` in preprocess.cu (a float pointer, seven
        // ints, a float pointer as its address); every patch lies inside the window (checked
        // above), `out` holds n * bands * p * p floats by this function's contract, and threads
        // past that return at once.
        unsafe { launch.launch(LaunchConfig::for_num_elems(t32)) }.map_err(driver("cuLaunchKernel gather_patches"))?;
        Ok(())
    }

    /// [`Kernels::argmax`] over `[n][k][pixels]` scores at device address `scores` (the output
    /// tensor ONNX Runtime wrote).
    ///
    /// # Safety
    /// `scores` must point to at least `n * k * pixels` float32 values of device memory of this
    /// context, written before this stream runs the kernel (the session's run is queued before it
    /// on this stream, or has finished).
    pub unsafe fn argmax_from(
        &self,
        scores: u64,
        (n, k, pixels): (usize, usize, usize),
        logits: bool,
        cls: &mut CudaSlice<u32>,
        conf: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let bad = |message: String| GpuError::Shape {
            kernel: "argmax_confidence",
            message,
        };
        let m = n * pixels;
        if k == 0 || cls.len() < m || conf.len() < m {
            return Err(bad(format!(
                "{n} x {k} x {pixels} scores need {m} outputs; got {} and {}",
                cls.len(),
                conf.len()
            )));
        }
        let dim = |v: usize| i32::try_from(v).map_err(|_| bad(format!("{v} does not fit a 32-bit index")));
        let (n32, k32, p32) = (dim(n)?, dim(k)?, dim(pixels)?);
        let m32 = u32::try_from(m).map_err(|_| bad(format!("{m} pixels do not fit one launch")))?;
        let lg = i32::from(logits);
        let mut launch = self.stream.launch_builder(&self.argmax);
        launch
            .arg(&scores)
            .arg(&n32)
            .arg(&k32)
            .arg(&p32)
            .arg(&lg)
            .arg(cls)
            .arg(conf);
        // SAFETY: the arguments match `argmax_confidence` (a float pointer as its address, four
        // ints, a uint pointer, a float pointer); `scores` holds n * k * pixels values by this
        // function's contract, `cls` and `conf` n * pixels each (checked above).
        unsafe { launch.launch(LaunchConfig::for_num_elems(m32)) }.map_err(driver("cuLaunchKernel argmax"))?;
        Ok(())
    }
}
