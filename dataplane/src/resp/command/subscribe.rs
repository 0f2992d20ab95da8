//! `SUBSCRIBE` and `UNSUBSCRIBE`: pgline has no pub/sub, only the channel RESP2 clients receive
//! client-tracking invalidations on (`__redis__:invalidate`, issue 18). The engine refuses any
//! other channel; `PSUBSCRIBE`, `SSUBSCRIBE` and their opposites are refused as unknown commands
//! would be, with a reason.

use super::{check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse_subscribe(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -2, "subscribe")?;
    Ok(Command::Subscribe {
        channels: args.slice(1),
    })
}

pub(super) fn parse_unsubscribe(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -1, "unsubscribe")?;
    Ok(Command::Unsubscribe {
        channels: args.slice(1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{parse, strings};
    use super::*;

    #[test]
    fn parses() {
        match parse(&["subscribe", "__redis__:invalidate"]) {
            Ok(Command::Subscribe { channels }) => {
                assert_eq!(strings(channels), ["__redis__:invalidate"])
            }
            other => panic!("{other:?}"),
        }
        match parse(&["UNSUBSCRIBE"]) {
            Ok(Command::Unsubscribe { channels }) => assert!(channels.is_empty()),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse(&["SUBSCRIBE"]).map(|_| ()),
            Err(CommandError::WrongArity("subscribe"))
        );
        assert!(matches!(
            parse(&["psubscribe", "x"]),
            Ok(Command::PubSubOther { .. })
        ));
    }
}
