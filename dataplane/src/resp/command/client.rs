//! `CLIENT <subcommand>`: the connection-management subcommands clients send on connect.
//!
//! Recognised: `SETNAME name`, `GETNAME`, `SETINFO attr value` (redis-py and go-redis send
//! `LIB-NAME`/`LIB-VER`), `ID`, `INFO`, and client-side caching's `TRACKING`, `CACHING`,
//! `TRACKINGINFO`, `GETREDIR` (issue 18). Anything else is [`ClientSub::Other`] for the engine
//! to refuse. Arity errors name the subcommand as Redis does (`'client|setname'`).

use super::{arg, check_arity, parse_i64, Command, CommandError};
use crate::resp::Args;

/// `CLIENT TRACKING ON|OFF [REDIRECT id] [PREFIX p ...] [BCAST] [OPTIN] [OPTOUT] [NOLOOP]`, its
/// syntax checked; the rules between options are the engine's.
#[derive(Clone, Copy, Debug)]
pub struct TrackingArgs<'a> {
    pub on: bool,
    pub redirect: Option<i64>,
    pub bcast: bool,
    pub optin: bool,
    pub optout: bool,
    pub noloop: bool,
    /// The options as given (after `ON|OFF`), for [`TrackingArgs::prefixes`].
    options: Args<'a>,
}

impl<'a> TrackingArgs<'a> {
    /// The `PREFIX` values, in order (the options were checked by the parse: every `PREFIX`
    /// and `REDIRECT` has its value).
    pub fn prefixes(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let options = self.options;
        let mut i = 0;
        std::iter::from_fn(move || loop {
            let word = options.get(i)?;
            if word.eq_ignore_ascii_case(b"PREFIX") {
                i += 2;
                return options.get(i - 1);
            }
            i += if word.eq_ignore_ascii_case(b"REDIRECT") {
                2
            } else {
                1
            };
        })
    }

    pub fn has_prefixes(&self) -> bool {
        self.prefixes().next().is_some()
    }
}

fn parse_tracking(args: Args<'_>) -> Result<TrackingArgs<'_>, CommandError> {
    let switch = arg(&args, 2);
    let on = if switch.eq_ignore_ascii_case(b"ON") {
        true
    } else if switch.eq_ignore_ascii_case(b"OFF") {
        false
    } else {
        return Err(CommandError::Syntax);
    };
    let options = args.slice(3);
    let mut t = TrackingArgs {
        on,
        redirect: None,
        bcast: false,
        optin: false,
        optout: false,
        noloop: false,
        options,
    };
    let mut i = 0;
    while let Some(word) = options.get(i) {
        let is = |s: &[u8]| word.eq_ignore_ascii_case(s);
        if is(b"REDIRECT") || is(b"PREFIX") {
            let value = options.get(i + 1).ok_or(CommandError::Syntax)?;
            if is(b"REDIRECT") {
                t.redirect = Some(parse_i64(value).ok_or(CommandError::NotAnInteger)?);
            }
            i += 2;
            continue;
        }
        if is(b"BCAST") {
            t.bcast = true;
        } else if is(b"OPTIN") {
            t.optin = true;
        } else if is(b"OPTOUT") {
            t.optout = true;
        } else if is(b"NOLOOP") {
            t.noloop = true;
        } else {
            return Err(CommandError::Syntax);
        }
        i += 1;
    }
    Ok(t)
}

/// A `CLIENT` subcommand.
#[derive(Clone, Copy, Debug)]
pub enum ClientSub<'a> {
    SetName {
        name: &'a [u8],
    },
    GetName,
    SetInfo {
        attr: &'a [u8],
        value: &'a [u8],
    },
    Id,
    Info,
    Tracking(TrackingArgs<'a>),
    /// `CLIENT CACHING yes|no`.
    Caching {
        yes: bool,
    },
    TrackingInfo,
    GetRedir,
    /// Any other subcommand; `args` excludes `CLIENT` and the subcommand name.
    Other {
        name: &'a [u8],
        args: Args<'a>,
    },
}

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -2, "client")?;
    let name = arg(&args, 1);
    let is = |s: &[u8]| name.eq_ignore_ascii_case(s);
    let sub = if is(b"SETNAME") {
        check_arity(&args, 3, "client|setname")?;
        ClientSub::SetName {
            name: arg(&args, 2),
        }
    } else if is(b"GETNAME") {
        check_arity(&args, 2, "client|getname")?;
        ClientSub::GetName
    } else if is(b"SETINFO") {
        check_arity(&args, 4, "client|setinfo")?;
        ClientSub::SetInfo {
            attr: arg(&args, 2),
            value: arg(&args, 3),
        }
    } else if is(b"ID") {
        check_arity(&args, 2, "client|id")?;
        ClientSub::Id
    } else if is(b"INFO") {
        check_arity(&args, 2, "client|info")?;
        ClientSub::Info
    } else if is(b"TRACKING") {
        check_arity(&args, -3, "client|tracking")?;
        ClientSub::Tracking(parse_tracking(args)?)
    } else if is(b"CACHING") {
        check_arity(&args, 3, "client|caching")?;
        let v = arg(&args, 2);
        let yes = if v.eq_ignore_ascii_case(b"YES") {
            true
        } else if v.eq_ignore_ascii_case(b"NO") {
            false
        } else {
            return Err(CommandError::Syntax);
        };
        ClientSub::Caching { yes }
    } else if is(b"TRACKINGINFO") {
        check_arity(&args, 2, "client|trackinginfo")?;
        ClientSub::TrackingInfo
    } else if is(b"GETREDIR") {
        check_arity(&args, 2, "client|getredir")?;
        ClientSub::GetRedir
    } else {
        ClientSub::Other {
            name,
            args: args.slice(2),
        }
    };
    Ok(Command::Client { sub })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{parse, strings};
    use super::*;

    fn sub(words: &[&str]) -> Result<ClientSub<'static>, CommandError> {
        match parse(words)? {
            Command::Client { sub } => Ok(sub),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn subcommands() {
        assert!(matches!(
            sub(&["CLIENT", "setname", "app"]),
            Ok(ClientSub::SetName { name: b"app" })
        ));
        assert!(matches!(
            sub(&["client", "GETNAME"]),
            Ok(ClientSub::GetName)
        ));
        assert!(matches!(
            sub(&["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]),
            Ok(ClientSub::SetInfo {
                attr: b"LIB-NAME",
                value: b"redis-py"
            })
        ));
        assert!(matches!(sub(&["CLIENT", "id"]), Ok(ClientSub::Id)));
        assert!(matches!(sub(&["CLIENT", "INFO"]), Ok(ClientSub::Info)));
        match sub(&["CLIENT", "KILL", "ID", "3"]) {
            Ok(ClientSub::Other { name, args }) => {
                assert_eq!(name, b"KILL");
                assert_eq!(strings(args), ["ID", "3"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arity() {
        let check = |words: &[&str], name| {
            assert_eq!(
                sub(words).map(|_| ()),
                Err(CommandError::WrongArity(name)),
                "{words:?}"
            );
        };
        check(&["CLIENT"], "client");
        check(&["CLIENT", "SETNAME"], "client|setname");
        check(&["CLIENT", "GETNAME", "x"], "client|getname");
        check(&["CLIENT", "SETINFO", "LIB-NAME"], "client|setinfo");
        check(&["CLIENT", "ID", "x"], "client|id");
        check(&["CLIENT", "INFO", "x"], "client|info");
        check(&["CLIENT", "TRACKING"], "client|tracking");
        check(&["CLIENT", "CACHING"], "client|caching");
        check(&["CLIENT", "GETREDIR", "x"], "client|getredir");
        check(&["CLIENT", "TRACKINGINFO", "x"], "client|trackinginfo");
    }

    #[test]
    fn tracking_options() {
        let Ok(ClientSub::Tracking(t)) = sub(&[
            "client", "tracking", "on", "bcast", "PREFIX", "a:", "noloop", "prefix", "PREFIX",
            "redirect", "12", "PREFIX", "PREFIX", "prefix", "x",
        ]) else {
            panic!()
        };
        assert!(t.on && t.bcast && t.noloop && !t.optin && !t.optout);
        assert_eq!(t.redirect, Some(12));
        let prefixes: Vec<_> = t.prefixes().collect();
        assert_eq!(prefixes, [&b"a:"[..], b"PREFIX", b"PREFIX", b"x"]);
        let Ok(ClientSub::Tracking(t)) = sub(&["CLIENT", "TRACKING", "off"]) else {
            panic!()
        };
        assert!(!t.on && !t.has_prefixes());
        for bad in [
            &["CLIENT", "TRACKING", "maybe"][..],
            &["CLIENT", "TRACKING", "on", "redirect"],
            &["CLIENT", "TRACKING", "on", "prefix"],
            &["CLIENT", "TRACKING", "on", "sideways"],
            &["CLIENT", "CACHING", "perhaps"],
        ] {
            assert_eq!(sub(bad).map(|_| ()), Err(CommandError::Syntax), "{bad:?}");
        }
        assert_eq!(
            sub(&["CLIENT", "TRACKING", "on", "redirect", "x"]).map(|_| ()),
            Err(CommandError::NotAnInteger)
        );
        assert!(matches!(
            sub(&["CLIENT", "CACHING", "Yes"]),
            Ok(ClientSub::Caching { yes: true })
        ));
    }
}
